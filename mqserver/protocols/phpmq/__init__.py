"""PHPMQ (php-mq/protocol): length-prefixed frames, both revisions in the wild."""
