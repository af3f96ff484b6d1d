<?php
/*
 * A PHPMQ client in plain PHP (no extension, no Composer package): publish
 * two messages, consume them one at a time with a credit window of 1, ack
 * each.  Frames are built exactly as php-mq/protocol builds them, so this is
 * also a template for talking to mqserver from an existing PHP code base.
 *
 * Usage: php phpmq_client.php [HOST] [PORT]      (default 127.0.0.1 9100)
 * Prints one "ok ..." line per step and "done"; exits 1 on the first failure.
 */

declare(strict_types=1);

const PUBLISH = 1;
const CONSUME = 2;
const DISPATCH = 3;
const ACK = 4;
const QUEUE = 1;
const CONTENT = 2;
const MESSAGE_ID = 3;
const COUNT = 4;
const TTL = 5;

function fail(string $why): never
{
    fwrite(STDERR, "FAIL: $why\n");
    exit(1);
}

/** @param resource $socket */
function read_exactly($socket, int $length): string
{
    $data = '';
    while (strlen($data) < $length) {
        $chunk = fread($socket, $length - strlen($data));
        if ($chunk === false || $chunk === '') {
            fail(stream_get_meta_data($socket)['timed_out'] ? 'timed out' : 'connection closed');
        }
        $data .= $chunk;
    }
    return $data;
}

/**
 * One frame: message header H + version 01 + 3-digit type + 2-digit package
 * count, then per package P + 2-digit type + 29-digit length + content.
 *
 * @param resource $socket
 * @param array<int, array{int, string}> $packages
 */
function send_frame($socket, int $type, array $packages): void
{
    $frame = sprintf('H%02d%03d%02d', 1, $type, count($packages));
    foreach ($packages as [$packageType, $content]) {
        $frame .= sprintf('P%02d%029d', $packageType, strlen($content)) . $content;
    }
    fwrite($socket, $frame);
}

/**
 * @param resource $socket
 * @return array{type: int, packages: array<int, string>}
 */
function receive_frame($socket): array
{
    $header = read_exactly($socket, 8);
    $packages = [];
    for ($i = 0, $count = (int) substr($header, 6, 2); $i < $count; $i++) {
        $packageHeader = read_exactly($socket, 32);
        $length = (int) substr($packageHeader, 3);
        $packages[(int) substr($packageHeader, 1, 2)] = $length > 0 ? read_exactly($socket, $length) : '';
    }
    return ['type' => (int) substr($header, 3, 3), 'packages' => $packages];
}

function check(bool $condition, string $step): void
{
    if (!$condition) {
        fail($step);
    }
    echo "ok $step\n";
}

[$host, $port] = [$argv[1] ?? '127.0.0.1', (int) ($argv[2] ?? 9100)];
$socket = stream_socket_client("tcp://$host:$port", $errno, $error, 5.0);
if ($socket === false) {
    fail("connect to $host:$port: $error");
}
stream_set_timeout($socket, 10);

$queue = 'example-php-' . bin2hex(random_bytes(4));
foreach (['first job', 'second job'] as $body) {
    send_frame($socket, PUBLISH, [[QUEUE, $queue], [CONTENT, $body], [TTL, '3600']]);
}
send_frame($socket, CONSUME, [[QUEUE, $queue], [COUNT, '1']]);

foreach (['first job', 'second job'] as $body) {
    $frame = receive_frame($socket);
    check($frame['type'] === DISPATCH && $frame['packages'][CONTENT] === $body, "dispatch of '$body'");
    // the next dispatch comes only after this ack: the window is 1
    send_frame($socket, ACK, [[QUEUE, $queue], [MESSAGE_ID, $frame['packages'][MESSAGE_ID]]]);
    echo "ok ack of '$body'\n";
}
fclose($socket);
echo "done\n";
