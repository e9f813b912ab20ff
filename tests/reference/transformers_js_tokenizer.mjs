// Loads an export-hf bundle's tokenizer with npm's @huggingface/transformers (transformers.js)
// AutoTokenizer from the local directory, and checks it against tpusim's own tokenizer: for every
// {text, ids} case (ids: tpusim's encoding, `tpusim generate --json` prompt_tokens), encode(text)
// must give ids and decode(ids) must give text back.
//
// Usage: node tests/reference/transformers_js_tokenizer.mjs MODULE HF_DIR CASES.json
//   MODULE: the package's dist/transformers.node.mjs (scripts/setup.sh --with-npm installs it)
// Prints one line per case; exits 1 on any difference.
import fs from 'node:fs';
import path from 'node:path';
import { pathToFileURL } from 'node:url';

const [modulePath, hfDir, casesPath] = process.argv.slice(2);
const { AutoTokenizer, env } = await import(pathToFileURL(modulePath).href);
env.allowRemoteModels = false;  // the local directory only, never a hub
env.allowLocalModels = true;
env.localModelPath = path.dirname(path.resolve(hfDir)) + path.sep;
const tokenizer = await AutoTokenizer.from_pretrained(path.basename(path.resolve(hfDir)));
const cases = JSON.parse(fs.readFileSync(casesPath, 'utf8'));
let failures = 0;
for (const { text, ids } of cases) {
  const encoded = Array.from(tokenizer.encode(text));
  const decoded = tokenizer.decode(ids);
  const same = JSON.stringify(encoded) === JSON.stringify(ids) && decoded === text;
  failures += same ? 0 : 1;
  console.log(`${same ? 'ok  ' : 'FAIL'} ${JSON.stringify(text)}: ${ids.length} tokens` +
              (same ? '' : `; transformers.js encodes ${JSON.stringify(encoded)} (tpusim ` +
                           `${JSON.stringify(ids)}), decodes ${JSON.stringify(decoded)}`));
}
process.exit(failures ? 1 : 0);
