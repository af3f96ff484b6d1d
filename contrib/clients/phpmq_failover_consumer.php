<?php
/*
 * A PHPMQ consumer that survives a failover (docs/ha.md): it knows every
 * node's address (or a load balancer's), and whenever its connection drops
 * or is refused it tries the next one after a short pause and sends its
 * CONSUME again.  A message it had not acked comes again from the new
 * active, so a repeat id is acked and otherwise ignored.
 *
 * Usage: php phpmq_failover_consumer.php QUEUE COUNT HOST:PORT [HOST:PORT ...]
 * Prints "got CONTENT" per first delivery and "reconnected to HOST:PORT"
 * after each failover; exits 0 once COUNT distinct messages were acked, 1 if
 * none came for 60 s.
 */

declare(strict_types=1);

const CONSUME = 2;
const DISPATCH = 3;
const ACK = 4;
const QUEUE = 1;
const CONTENT = 2;
const MESSAGE_ID = 3;
const COUNT = 4;

/** @param resource $socket */
function read_exactly($socket, int $length): ?string
{
    $data = '';
    while (strlen($data) < $length) {
        $chunk = fread($socket, $length - strlen($data));
        if ($chunk === false || $chunk === '') {
            return null;  // closed or timed out: reconnect
        }
        $data .= $chunk;
    }
    return $data;
}

/**
 * @param resource $socket
 * @param array<int, array{int, string}> $packages
 */
function send_frame($socket, int $type, array $packages): bool
{
    $frame = sprintf('H%02d%03d%02d', 1, $type, count($packages));
    foreach ($packages as [$packageType, $content]) {
        $frame .= sprintf('P%02d%029d', $packageType, strlen($content)) . $content;
    }
    return @fwrite($socket, $frame) === strlen($frame);
}

/**
 * @param resource $socket
 * @return array{type: int, packages: array<int, string>}|null
 */
function receive_frame($socket): ?array
{
    $header = read_exactly($socket, 8);
    if ($header === null) {
        return null;
    }
    $packages = [];
    for ($i = 0, $count = (int) substr($header, 6, 2); $i < $count; $i++) {
        $packageHeader = read_exactly($socket, 32);
        $length = $packageHeader === null ? 0 : (int) substr($packageHeader, 3);
        $content = $length > 0 ? read_exactly($socket, $length) : '';
        if ($packageHeader === null || $content === null) {
            return null;
        }
        $packages[(int) substr($packageHeader, 1, 2)] = $content;
    }
    return ['type' => (int) substr($header, 3, 3), 'packages' => $packages];
}

[$queue, $wanted] = [$argv[1], (int) $argv[2]];
$nodes = array_slice($argv, 3);
$seen = [];
$lastProgress = microtime(true);
for ($attempt = 0; count($seen) < $wanted; $attempt++) {
    if (microtime(true) - $lastProgress > 60) {
        exit(1);
    }
    $node = $nodes[$attempt % count($nodes)];
    $socket = @stream_socket_client("tcp://$node", $errno, $error, 5.0);
    if ($socket === false) {
        usleep(200000);  // refused: a standby, or the active is gone
        continue;
    }
    if ($attempt > 0) {
        echo "reconnected to $node\n";
    }
    stream_set_timeout($socket, 5);
    send_frame($socket, CONSUME, [[QUEUE, $queue], [COUNT, '1']]);
    while (count($seen) < $wanted && ($frame = receive_frame($socket)) !== null) {
        if ($frame['type'] !== DISPATCH) {
            continue;
        }
        $id = $frame['packages'][MESSAGE_ID];
        send_frame($socket, ACK, [[QUEUE, $queue], [MESSAGE_ID, $id]]);
        $content = $frame['packages'][CONTENT];
        if (!isset($seen[$content])) {
            $seen[$content] = true;
            $lastProgress = microtime(true);
            echo "got $content\n";
        }
    }
    fclose($socket);
    usleep(200000);
}
echo "done\n";
