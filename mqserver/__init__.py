"""mqserver: one Twisted broker for the MQKS, PHPMQ and eMQP wire protocols."""

__version__ = "0.1.0"
