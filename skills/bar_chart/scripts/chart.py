"""bar_chart: the parameters on stdin -> ~/chart.png (a bar chart, stdlib only) and a result naming it."""
import json
import math
import os
import struct
import sys
import zlib

HEIGHT = 240            # pixels of the plot
PAD = 16                # pixels around it
BAR, GAP = 24, 8        # a bar's width and the space between bars
BACKGROUND, AXIS = (255, 255, 255), (90, 90, 90)
UP, DOWN = (52, 120, 214), (214, 84, 52)


def png(width: int, height: int, pixels: list[bytearray]) -> bytes:
    """An 8-bit RGB PNG of `pixels` (one bytearray of width*3 bytes per row)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    raw = b"".join(b"\x00" + bytes(row) for row in pixels)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def chart(values: list[float]) -> tuple[int, int, list[bytearray]]:
    top, bottom = max(max(values), 0.0), min(min(values), 0.0)
    span = (top - bottom) or 1.0
    width = 2 * PAD + len(values) * (BAR + GAP) - GAP
    height = 2 * PAD + HEIGHT
    pixels = [bytearray(bytes(BACKGROUND) * width) for _ in range(height)]

    def fill(x0: int, x1: int, y0: int, y1: int, colour: tuple[int, int, int]) -> None:
        for y in range(max(y0, 0), min(y1, height)):
            pixels[y][x0 * 3:x1 * 3] = bytes(colour) * (x1 - x0)

    base = PAD + round(top / span * HEIGHT)             # the row of the value 0
    for i, value in enumerate(values):
        x = PAD + i * (BAR + GAP)
        size = round(abs(value) / span * HEIGHT)
        if value >= 0:
            fill(x, x + BAR, base - size, base, UP)
        else:
            fill(x, x + BAR, base, base + size, DOWN)
    fill(PAD // 2, width - PAD // 2, base, base + 1, AXIS)
    return width, height, pixels


def main() -> int:
    params = json.load(sys.stdin)
    values = [float(v) for v in params["values"]]
    if not values or not all(math.isfinite(v) for v in values):
        print(json.dumps({"success": False, "error": "数值无效"}, ensure_ascii=False))
        return 0
    path = os.path.join(os.environ["HOME"], "chart.png")
    with open(path, "wb") as out:
        out.write(png(*chart(values)))
    title = (params.get("title") or "").strip()
    entry = {"path": path, **({"caption": title} if title else {})}
    print(json.dumps({"success": True, "files": [entry],
                      "output": f"柱状图：{len(values)} 个数值，最大 {max(values):g}，最小 {min(values):g}"},
                     ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
