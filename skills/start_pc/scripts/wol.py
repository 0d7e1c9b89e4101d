#!/usr/bin/env python3
"""Send a Wake-on-LAN magic packet. Parameters come as JSON on stdin; one JSON object goes to stdout.

Stdlib only, so the skill directory can be copied anywhere and run with any Python 3.
"""
import ipaddress
import json
import re
import socket
import sys

MAC_RE = re.compile(r"[0-9A-Fa-f]{2}([:-])(?:[0-9A-Fa-f]{2}\1){4}[0-9A-Fa-f]{2}"
                    r"|[0-9A-Fa-f]{4}\.[0-9A-Fa-f]{4}\.[0-9A-Fa-f]{4}")


def fail(message):
    print(json.dumps({"success": False, "error": message}, ensure_ascii=False))
    sys.exit(0)


def parse_mac(text):
    """'aa:bb:cc:dd:ee:ff', 'AA-BB-…' or 'aabb.ccdd.eeff' -> 6 bytes; None when malformed."""
    if not isinstance(text, str) or not MAC_RE.fullmatch(text.strip()):
        return None
    return bytes.fromhex(re.sub(r"[:.\-]", "", text.strip()))


def magic_packet(mac):
    return b"\xff" * 6 + mac * 16


def main():
    try:
        params = json.load(sys.stdin)
    except ValueError:
        fail("parameters on stdin are not valid JSON")
    if not isinstance(params, dict):
        fail("parameters must be a JSON object")
    mac = parse_mac(params.get("mac"))
    if mac is None:
        fail("mac must be six hex pairs separated by ':' or '-', or three groups of four hex digits "
             "separated by '.', e.g. aa:bb:cc:dd:ee:ff")
    broadcast = params.get("broadcast", "255.255.255.255")
    port = params.get("port", 9)
    try:
        broadcast = str(ipaddress.IPv4Address(broadcast))
    except (ValueError, TypeError):
        fail(f"broadcast must be an IPv4 address, got {broadcast!r}")
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        fail(f"port must be an integer from 1 to 65535, got {port!r}")

    packet = magic_packet(mac)
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
            sent = sock.sendto(packet, (broadcast, port))
    except OSError as exc:
        fail(f"could not send the magic packet to {broadcast}:{port}: {exc.strerror or exc}")
    print(json.dumps({"success": True, "mac": ":".join(f"{b:02x}" for b in mac),
                      "broadcast": broadcast, "port": port, "bytes": sent}))


if __name__ == "__main__":
    main()
