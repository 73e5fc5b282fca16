"""Writes a file of Unicode edge cases for the tokenizer parity test
(deterministic): combining marks, emoji (ZWJ sequences, flags, skin tones),
CJK, right-to-left scripts, every kind of space, long runs of spaces, digits
and punctuation, contractions in both cases, control characters, and invalid
UTF-8 (stray continuation bytes, overlongs, surrogates, truncated sequences,
bytes F5-FF).

    python unicode_edge_cases.py OUT [MIB]
"""
import sys

SAMPLES = [
    "e\u0301te\u0301 cafe\u0301 Zu\u0308rich a\u030a\u0301\u0302 ", "Ω≈ç√∫˜µ≤≥÷ ",
    "👍🏽 👩‍👩‍👧‍👦 🇩🇪🇯🇵 🧑🏿‍🚀 ❤️‍🔥 ", "漢字かなカナ한국어 中文测试，标点。", "שלום עולם ",
    "مرحبا بالعالم ١٢٣ ", "\u00a0\u2003\u3000\u200b\ufeff\u2028\u2029 ",
    "x \u0085y a \ufeffb \u0085\u0085 z\ufeff\ufeff ", "crlf line \r\nnext\r\n\r\n",
    "trailing spaces   \nend \n", "行末。\n次の行、\n",
    "I'm you're we've they'll he'd it's I'M YOU'RE 'S 'll ", "\t\ttabs\r\nwindows\r\n",
    "x²³ ½ ⅓ Ⅻ ٣ ߀ 𝟘𝟙 ", "\u0000\u0001\u001f\u007f ", "$$$ !!! ??? ... --- === ",
    "𝓗𝓮𝓵𝓵𝓸 𐍈 𠀀𠀁 ", "naïve coöperate façade ",
]
INVALID = bytes([0x80, 0xbf, 0xc0, 0xaf, 0xe0, 0x80, 0xaf, 0xed, 0xa0, 0x80, 0xf5, 0xff, 0xc3,
                 0x20, 0xe2, 0x82, 0x41])


def main():
    out, mib = sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 1
    seed = 12345

    def rand(n):
        nonlocal seed
        seed = (seed * 1103515245 + 12345) % 2147483648
        return seed % n

    parts, size = [], 0
    while size < mib * 1048576:
        kind = rand(10)
        if kind == 0:
            p = (" " * (1 + rand(3000)) + "word").encode()
        elif kind == 1:
            p = "".join(str(rand(10)) for _ in range(1 + rand(5000))).encode()
        elif kind == 2:
            p = INVALID[rand(8):]
        elif kind == 3:
            p = ("\n" * (1 + rand(20)) + " " * rand(4)).encode()
        else:
            p = (SAMPLES[rand(len(SAMPLES))] * (1 + rand(4))).encode()
        parts.append(p)
        size += len(p)
    with open(out, "wb") as f:
        f.write(b"".join(parts))


if __name__ == "__main__":
    main()
