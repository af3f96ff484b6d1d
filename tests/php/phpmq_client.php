<?php
/*
 * A small PHPMQ client, run by tests/integration/test_phpmq_server.py against a
 * real `twistd -n mqserver --protocol=phpmq`.
 *
 * Frames are built the way php-mq/protocol builds them (MessageHeader:
 * sprintf('%s%02d%03d%02d'), PacketHeader: sprintf('%s%02d%029d'), content
 * concatenated with no separators), so the server is checked against PHP's own
 * formatting rather than against our Python encoder.
 *
 * Usage: php phpmq_client.php HOST PORT
 * Prints one "ok ..." line per check and "done" at the end; exits 1 on the
 * first failed check.
 */

declare(strict_types=1);

const PUBLISH = 1;
const CONSUME = 2;
const DISPATCH = 3;
const ACK = 4;
const REQUEUE = 5;
const DEAD_LETTER = 6;
const QUEUE = 1;
const CONTENT = 2;
const MESSAGE_ID = 3;
const COUNT = 4;
const TTL = 5;

final class Connection
{
    /** @var resource */
    private $socket;
    private string $buffer = '';

    public function __construct(string $host, int $port)
    {
        $socket = stream_socket_client("tcp://$host:$port", $errno, $error, 5.0);
        if ($socket === false) {
            fail("connect to $host:$port: $error");
        }
        stream_set_timeout($socket, 5);
        $this->socket = $socket;
    }

    /** @param array<int, array{int, string}> $packages */
    public function send(int $type, array $packages): void
    {
        $frame = sprintf('%s%02d%03d%02d', 'H', 1, $type, count($packages));
        foreach ($packages as [$packageType, $content]) {
            $frame .= sprintf('%s%02d%029d', 'P', $packageType, strlen($content)) . $content;
        }
        if (fwrite($this->socket, $frame) !== strlen($frame)) {
            fail('short write');
        }
    }

    /** @return array{type: int, count: int, packages: array<int, string>} */
    public function receive(): array
    {
        $header = $this->read(8);
        if ($header[0] !== 'H') {
            fail("bad message header $header");
        }
        $count = (int) substr($header, 6, 2);
        $packages = [];
        for ($i = 0; $i < $count; $i++) {
            $packageHeader = $this->read(32);
            $length = (int) substr($packageHeader, -29);
            $packages[(int) substr($packageHeader, 1, 2)] = $length > 0 ? $this->read($length) : '';
        }
        return ['type' => (int) substr($header, 3, 3), 'count' => $count, 'packages' => $packages];
    }

    /** True if no byte arrives within $seconds. */
    public function quiet(float $seconds): bool
    {
        if ($this->buffer !== '') {
            return false;
        }
        $read = [$this->socket];
        $write = $except = null;
        $ready = stream_select($read, $write, $except, 0, (int) ($seconds * 1e6));
        return $ready === 0;
    }

    private function read(int $length): string
    {
        while (strlen($this->buffer) < $length) {
            $chunk = fread($this->socket, 65536);
            if ($chunk === false || $chunk === '') {
                $meta = stream_get_meta_data($this->socket);
                fail($meta['timed_out'] ? 'timed out reading' : 'connection closed');
            }
            $this->buffer .= $chunk;
        }
        $data = substr($this->buffer, 0, $length);
        $this->buffer = (string) substr($this->buffer, $length);
        return $data;
    }
}

function fail(string $why): never
{
    fwrite(STDERR, "FAIL: $why\n");
    exit(1);
}

function check(bool $condition, string $what): void
{
    if (!$condition) {
        fail($what);
    }
    echo "ok $what\n";
}

/** @return array{type: int, count: int, packages: array<int, string>} */
function dispatched(Connection $connection, string $body, int $count): array
{
    $frame = $connection->receive();
    $label = addcslashes($body, "\0..\37");
    check(
        $frame['type'] === DISPATCH && $frame['count'] === $count && $frame['packages'][CONTENT] === $body,
        "dispatch of '$label' with $count packages"
    );
    check(preg_match('/^[0-9a-f]{32}$/', $frame['packages'][MESSAGE_ID]) === 1, "id of '$label' is 32 hex");
    return $frame;
}

[$host, $port] = [$argv[1] ?? '127.0.0.1', (int) ($argv[2] ?? 9100)];

// Revision 2018: publish with TTL, consume with a window of 2, ack, requeue, dead letter.
$client = new Connection($host, $port);
foreach (['first', 'second', 'third'] as $body) {
    $client->send(PUBLISH, [[QUEUE, 'php-jobs'], [CONTENT, $body], [TTL, '3600']]);
}
$client->send(CONSUME, [[QUEUE, 'php-jobs'], [COUNT, '2']]);
$first = dispatched($client, 'first', 4);
$ttl = (int) $first['packages'][TTL];
check($ttl > 3500 && $ttl <= 3600, "remaining TTL $ttl is about 3600");
$second = dispatched($client, 'second', 4);
check($client->quiet(0.5), 'window of 2 holds the third message back');

$client->send(ACK, [[QUEUE, 'php-jobs'], [MESSAGE_ID, $first['packages'][MESSAGE_ID]]]);
$third = dispatched($client, 'third', 4);

$client->send(REQUEUE, [[QUEUE, 'php-jobs'], [MESSAGE_ID, $second['packages'][MESSAGE_ID]], [TTL, '60']]);
$again = dispatched($client, 'second', 4);
check($again['packages'][MESSAGE_ID] === $second['packages'][MESSAGE_ID], 'requeued message keeps its id');
$ttl = (int) $again['packages'][TTL];
check($ttl > 0 && $ttl <= 60, "requeued message has the new TTL ($ttl)");

$client->send(ACK, [[QUEUE, 'php-jobs'], [MESSAGE_ID, $third['packages'][MESSAGE_ID]]]);
$client->send(DEAD_LETTER, [[QUEUE, 'php-jobs'], [MESSAGE_ID, $again['packages'][MESSAGE_ID]]]);
check($client->quiet(0.5), 'nothing left after ack and dead letter');

// Revision 2017, as the pinned php-mq/client speaks it: no TTL, 3-package dispatch.
$legacy = new Connection($host, $port);
$legacy->send(PUBLISH, [[QUEUE, 'php-legacy'], [CONTENT, "multi\nline \0 body"]]);
$legacy->send(CONSUME, [[QUEUE, 'php-legacy'], [COUNT, '5']]);
$old = dispatched($legacy, "multi\nline \0 body", 3);
$legacy->send(ACK, [[QUEUE, 'php-legacy'], [MESSAGE_ID, $old['packages'][MESSAGE_ID]]]);
check($legacy->quiet(0.3), 'legacy queue drained');

echo "done\n";
