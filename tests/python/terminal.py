#!/usr/bin/env python3
"""What a terminal shows after the bytes of a typescript (script -q's
output): carriage returns, line feeds and ESC[K (erase to the end of the
line) applied, as a VT100 does; every other escape sequence kept out.
  terminal.py TYPESCRIPT [--until REGEX]   prints the screen's lines
--until stops after the first match of REGEX, a live line drawn after a
\r ESC[K (a snapshot mid-run)."""
import re
import sys


def screen(data: str) -> list:
    lines, row, col = [""], 0, 0
    i = 0
    while i < len(data):
        c = data[i]
        if c == "\x1b":
            m = re.match(r"\x1b\[([0-9;?]*)([A-Za-z])", data[i:])
            if m:
                if m.group(2) == "K":
                    lines[row] = lines[row][:col]
                i += len(m.group(0))
                continue
        if c == "\r":
            col = 0
        elif c == "\n":
            row += 1
            col = 0
            if row == len(lines):
                lines.append("")
        else:
            line = lines[row].ljust(col)
            lines[row] = line[:col] + c + line[col + 1:]
            col += 1
        i += 1
    return lines


def main() -> None:
    data = open(sys.argv[1], "rb").read().decode("utf-8", "replace")
    if len(sys.argv) > 3 and sys.argv[2] == "--until":
        m = re.search("\r\x1b\\[K" + sys.argv[3], data)
        if m:
            data = data[: m.end()]
    lines = screen(data)
    while lines and lines[-1] == "":
        lines.pop()
    print("\n".join(lines))


if __name__ == "__main__":
    main()
