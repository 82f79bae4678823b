// Browser test of `megatron plan`'s page, static (--html) and served (--serve).
//
//   node tests/web/plan_page_test.mjs <path-to-megatron> <artifact-dir>
//
// Drives headless Debian Chromium (/usr/bin/chromium) with playwright-core
// (no browser download). Exit 0: pass, 1: fail, 77: skipped (no Chromium or
// no playwright-core). Screenshots and the static HTML go to <artifact-dir>.
import { createRequire } from "node:module";
import { spawn, spawnSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const T0 = Date.now();
const CHROMIUM = "/usr/bin/chromium";
const LAUNCH_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                     "--disable-background-networking", "--disable-component-update", "--disable-sync"];
const WATCHDOG_MS = 120_000;   // the whole test normally takes a few seconds
const STEP_MS = 10_000;        // any single wait

function skip(msg) { console.log("SKIP: " + msg); process.exit(77); }
function log(msg) { console.log(`[${((Date.now() - T0) / 1000).toFixed(1)}s] ${msg}`); }

class TestFailure extends Error {}
function check(cond, msg) { if (!cond) throw new TestFailure(msg); }
function checkEq(actual, expected, what) {
  const a = JSON.stringify(actual), e = JSON.stringify(expected);
  if (a !== e) throw new TestFailure(`${what}: expected ${e}, got ${a}`);
}

// ---- arguments and prerequisites
const [megatronArg, artifactArg] = process.argv.slice(2);
if (!megatronArg || !artifactArg) {
  console.error("usage: node plan_page_test.mjs <path-to-megatron> <artifact-dir>");
  process.exit(2);
}
const MEGATRON = path.resolve(megatronArg);
const ARTIFACTS = path.resolve(artifactArg);
if (!fs.existsSync(MEGATRON)) { console.error(`FAIL: megatron binary not found: ${MEGATRON}`); process.exit(1); }
if (!fs.existsSync(CHROMIUM)) skip(`${CHROMIUM} not found (install Debian's chromium package)`);

function loadPlaywright() {
  // ESM imports ignore NODE_PATH; require() honours it. Fall back to the
  // project's node_modules next to this script.
  const here = path.dirname(fileURLToPath(import.meta.url));
  const tries = [
    () => createRequire(import.meta.url)("playwright-core"),
    () => createRequire(path.join(here, "../../package.json"))("playwright-core"),
  ];
  const errs = [];
  for (const t of tries) {
    try { return t(); } catch (e) { errs.push(e.code || String(e)); }
  }
  skip(`playwright-core not found (run \`npm ci\` in the project root or set NODE_PATH; ${errs.join("; ")})`);
}
const { chromium } = loadPlaywright();
fs.mkdirSync(ARTIFACTS, { recursive: true });

const PLAN_FLAGS = [
  "--world-size", "8", "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
  "--num-layers", "4", "--hidden-size", "256", "--num-attention-heads", "8", "--seq-length", "512",
  "--max-position-embeddings", "512", "--vocab-size", "50257", "--micro-batch-size", "1",
  "--global-batch-size", "8", "--gpus-per-node", "4",
];

// ---- children we started: killed on every way out
const children = new Set();
function killChildren() {
  for (const c of children) if (c.exitCode === null && c.signalCode === null) { try { c.kill("SIGKILL"); } catch {} }
}
process.on("exit", killChildren);
setTimeout(() => {
  console.error(`FAIL: the test did not finish within ${WATCHDOG_MS / 1000} s`);
  killChildren();
  process.exit(1);
}, WATCHDOG_MS).unref();

// ---- page helpers
function watchPage(page, label) {
  const problems = [], requests = [];
  page.on("pageerror", (e) => problems.push(`${label}: uncaught page error: ${e.message}`));
  page.on("console", (m) => {
    if (m.type() !== "error") return;
    const at = m.location()?.url;
    problems.push(`${label}: console error: ${m.text()}${at ? ` (${at})` : ""}`);
  });
  page.on("request", (r) => requests.push(r.url()));
  page.on("response", (r) => { if (r.status() >= 400) problems.push(`${label}: HTTP ${r.status()} for ${r.url()}`); });
  page.on("requestfailed", (r) => problems.push(`${label}: request failed: ${r.url()} (${r.failure()?.errorText})`));
  return { problems, requests };
}
function checkNoProblems(w) {
  check(w.problems.length === 0, "the page reported problems:\n  " + w.problems.join("\n  "));
}

const gpuCount = (page) => page.locator(".gpu").count();

async function readGrid(page) {
  return page.$$eval(".gpu", (cells) => cells.map((c) => ({
    rank: Number(c.dataset.rank), group: c.dataset.group, color: c.style.backgroundColor,
    w: c.getBoundingClientRect().width, h: c.getBoundingClientRect().height,
  })));
}

// Canonical form of a partition of ranks: sorted list of sorted groups.
const canon = (groups) => groups.map((g) => [...g].sort((a, b) => a - b)).sort((a, b) => a[0] - b[0]);
function partitionBy(cells, key) {
  const m = new Map();
  for (const c of cells) { if (!m.has(c[key])) m.set(c[key], []); m.get(c[key]).push(c.rank); }
  return canon([...m.values()]);
}

async function checkGroups(page, kind, expected) {
  await page.selectOption("#group-kind", kind);
  const cells = await readGrid(page);
  const want = canon(expected);
  checkEq(cells.map((c) => c.rank).sort((a, b) => a - b), want.flat().sort((a, b) => a - b), `${kind}: ranks drawn`);
  check(cells.every((c) => c.group !== "none"), `${kind}: some GPU has no ${kind} group`);
  checkEq(partitionBy(cells, "group"), want, `${kind} groups from data-group`);
  check(cells.every((c) => c.color !== ""), `${kind}: some GPU cell has no background colour`);
  checkEq(partitionBy(cells, "color"), want, `${kind} groups from the cell colours`);
  check(new Set(cells.map((c) => c.color)).size === expected.length,
        `${kind}: expected ${expected.length} distinct colours`);
  return cells;
}

async function checkBadge(page, valid, what) {
  const st = await page.evaluate(() => ({
    text: document.querySelector("#status").textContent,
    cls: document.querySelector("#status").className,
    valid: document.body.dataset.valid,
  }));
  if (valid) {
    check(st.text === "valid" && st.cls.split(/\s+/).includes("valid") && st.valid === "1",
          `${what}: expected the badge to say valid, got ${JSON.stringify(st)}`);
  } else {
    check(st.text.startsWith("invalid") && st.cls.split(/\s+/).includes("invalid") && st.valid === "0",
          `${what}: expected the badge to say invalid, got ${JSON.stringify(st)}`);
  }
}

async function checkCharts(page, stages, what) {
  const c = await page.evaluate(() => {
    const q = (s) => document.querySelectorAll(s);
    const box = (e) => { const r = e.getBoundingClientRect(); return [r.width, r.height]; };
    const mem = document.querySelector("#memory-svg"), tl = document.querySelector("#timeline-svg");
    return {
      mem: !!mem, memBox: mem ? box(mem) : null,
      memParts: [...q("#memory-svg rect.mem-part")].map((r) => Number(r.getAttribute("width"))),
      memRows: new Set([...q("#memory-svg rect.mem-part")].map((r) => r.getAttribute("y"))).size,
      tl: !!tl, tlBox: tl ? box(tl) : null,
      fwd: q("#timeline-svg rect.fwd").length, bwd: q("#timeline-svg rect.bwd").length,
      idle: q("#timeline-svg rect.idle").length,
      rows: new Set([...q("#timeline-svg rect.fwd, #timeline-svg rect.bwd")].map((r) => r.getAttribute("y"))).size,
      badRects: [...q("#timeline-svg rect, #memory-svg rect")].filter((r) =>
        ["x", "y", "width", "height"].some((a) => !Number.isFinite(Number(r.getAttribute(a))))).length,
      cards: q("#summary .card").length,
    };
  });
  check(c.mem, `${what}: no #memory-svg`);
  check(c.memBox[0] > 100 && c.memBox[1] > 30, `${what}: #memory-svg is not laid out (${c.memBox})`);
  check(c.memParts.length > 0 && c.memParts.every((w) => w > 0), `${what}: memory bars missing or empty`);
  checkEq(c.memRows, stages, `${what}: memory bars (one row per pipeline stage)`);
  check(c.tl, `${what}: no #timeline-svg`);
  check(c.tlBox[0] > 100 && c.tlBox[1] > 30, `${what}: #timeline-svg is not laid out (${c.tlBox})`);
  check(c.fwd > 0, `${what}: the timeline has no forward (rect.fwd) blocks`);
  check(c.bwd > 0, `${what}: the timeline has no backward (rect.bwd) blocks`);
  checkEq(c.fwd, c.bwd, `${what}: forward vs backward blocks`);
  checkEq(c.idle, stages, `${what}: timeline rows (rect.idle)`);
  checkEq(c.rows, stages, `${what}: timeline rows holding work`);
  checkEq(c.badRects, 0, `${what}: SVG rects with non-numeric geometry`);
  check(c.cards > 0, `${what}: no summary cards`);
}

// ---- the served page's process
function startServer(args) {
  return new Promise((resolve, reject) => {
    const proc = spawn(MEGATRON, args, { stdio: ["ignore", "pipe", "pipe"] });
    children.add(proc);
    let out = "", err = "", done = false;
    const finish = (f, v) => { if (!done) { done = true; clearTimeout(timer); f(v); } };
    const timer = setTimeout(() => finish(reject, new TestFailure(
      `megatron plan --serve printed no serving line within ${STEP_MS / 1000} s; stdout:\n${out}\nstderr:\n${err}`)), STEP_MS);
    proc.stdout.setEncoding("utf8");
    proc.stderr.setEncoding("utf8");
    proc.stdout.on("data", (d) => {
      out += d;
      const m = out.match(/serving the plan page on (http:\/\/127\.0\.0\.1:(\d+)\/)/);
      if (m) finish(resolve, { proc, url: m[1], port: Number(m[2]) });
    });
    proc.stderr.on("data", (d) => { err += d; });
    proc.on("error", (e) => finish(reject, new TestFailure(`could not start ${MEGATRON}: ${e.message}`)));
    proc.on("exit", (code, sig) => finish(reject, new TestFailure(
      `megatron plan --serve exited (code ${code}, signal ${sig}) before serving; stdout:\n${out}\nstderr:\n${err}`)));
  });
}
async function stopServer(proc) {
  if (!proc || proc.exitCode !== null || proc.signalCode !== null) return;
  const exited = new Promise((r) => proc.once("exit", r));
  proc.kill("SIGTERM");
  const t = setTimeout(() => proc.kill("SIGKILL"), 3000);
  await exited;
  clearTimeout(t);
}

async function postPlan(url, body) {
  const res = await fetch(url + "api/plan", { method: "POST", headers: { "Content-Type": "application/json" }, body,
                                               signal: AbortSignal.timeout(STEP_MS) });
  const text = await res.text();
  let json;
  try { json = JSON.parse(text); } catch { throw new TestFailure(`POST /api/plan ${JSON.stringify(body)}: the answer is not JSON (HTTP ${res.status}): ${text.slice(0, 300)}`); }
  return { status: res.status, type: res.headers.get("content-type") || "", json };
}

// Set a form input the way a user does (type, then leave the field: the
// browser fires `change`) and wait for the page's POST to /api/plan.
async function setInput(page, name, value) {
  const input = page.locator(`#plan-form [name="${name}"]`);
  const req = page.waitForRequest((r) => r.url().endsWith("/api/plan") && r.method() === "POST");
  const res = page.waitForResponse((r) => r.url().endsWith("/api/plan"));
  await input.fill(String(value));
  await input.press("Tab");
  const body = (await req).postDataJSON();
  const i = body.args.indexOf("--" + name);
  check(i >= 0 && body.args[i + 1] === String(value),
        `after setting ${name}=${value} the page posted args without it: ${JSON.stringify(body.args)}`);
  await res;
}

// ---- the checks
async function staticPage(browser) {
  const html = path.join(ARTIFACTS, "plan_tp2pp2dp2.html");
  fs.rmSync(html, { force: true });
  const r = spawnSync(MEGATRON, ["plan", ...PLAN_FLAGS, "--html", html], { encoding: "utf8", timeout: STEP_MS });
  check(r.status === 0, `megatron plan --html exited with ${r.status ?? r.signal ?? r.error}; stderr:\n${r.stderr}`);
  check(fs.existsSync(html) && fs.statSync(html).size > 0, `megatron plan --html did not write ${html}`);
  const fileUrl = pathToFileURL(html).href;

  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  const w = watchPage(page, "static page");
  await page.goto(fileUrl, { waitUntil: "load" });
  await page.waitForFunction(() => document.body.dataset.valid !== undefined, null, { timeout: STEP_MS });

  checkEq(await gpuCount(page), 8, "static page: number of .gpu cells");
  await checkBadge(page, true, "static page");
  checkEq(await page.locator("#errors li").count(), 0, "static page: error items");
  checkEq(await page.locator("#grid .node").count(), 2, "static page: nodes (8 GPUs, 4 per node)");
  const cells = await readGrid(page);
  check(cells.every((c) => c.w > 20 && c.h > 20), "static page: some GPU cell is not laid out: " + JSON.stringify(cells));

  // TP groups [0,1][2,3][4,5][6,7], explicitly as well as through the partition.
  const tp = await checkGroups(page, "tp", [[0, 1], [2, 3], [4, 5], [6, 7]]);
  const color = (r) => tp.find((c) => c.rank === r).color;
  check(color(0) === color(1), "tp: ranks 0 and 1 should share a colour");
  check(color(0) !== color(2), "tp: ranks 0 and 2 should have different colours");
  const pp = await checkGroups(page, "pp", [[0, 4], [1, 5], [2, 6], [3, 7]]);
  check(pp.find((c) => c.rank === 0).group === pp.find((c) => c.rank === 4).group, "pp: ranks 0 and 4 should share a group");
  await checkGroups(page, "dp", [[0, 2], [1, 3], [4, 6], [5, 7]]);
  await checkGroups(page, "tp-pp", [[0, 1, 4, 5], [2, 3, 6, 7]]);
  await page.selectOption("#group-kind", "tp");

  await checkCharts(page, 2, "static page");

  const form = await page.$$eval("#plan-form input, #plan-form select, #plan-form button",
                                 (es) => es.map((e) => ({ name: e.name || e.id, disabled: e.disabled, value: e.value })));
  check(form.length > 10, `static page: the form has only ${form.length} controls`);
  const enabled = form.filter((e) => !e.disabled).map((e) => e.name);
  checkEq(enabled, [], "static page: enabled form controls");
  const value = (n) => form.find((e) => e.name === n)?.value;
  checkEq([value("world-size"), value("tensor-model-parallel-size"), value("pipeline-model-parallel-size")],
          ["8", "2", "2"], "static page: form filled from the plan");

  await page.screenshot({ path: path.join(ARTIFACTS, "plan_static.png"), fullPage: true });
  const foreign = w.requests.filter((u) => u !== fileUrl);
  checkEq(foreign, [], "static page: network requests other than the file");
  checkNoProblems(w);
  await page.close();
  log("static page: ok");
}

async function servedPage(browser, server) {
  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  const w = watchPage(page, "served page");
  await page.goto(server.url, { waitUntil: "load" });
  await page.waitForFunction(() => document.body.dataset.valid !== undefined, null, { timeout: STEP_MS });
  checkEq(await gpuCount(page), 8, "served page: number of .gpu cells");
  await checkBadge(page, true, "served page");
  check(await page.locator('#plan-form [name="world-size"]').isEnabled(), "served page: the form is disabled");

  // 8 -> 16 GPUs: redrawn from the C++ planner's answer.
  await setInput(page, "world-size", 16);
  await page.waitForFunction(() => document.querySelectorAll(".gpu").length === 16, null, { timeout: STEP_MS })
    .catch(async () => { throw new TestFailure(`served page: expected 16 GPU cells after world-size=16, got ${await gpuCount(page)}`); });
  await checkBadge(page, true, "served page, world 16");
  checkEq(await page.locator("#grid .node").count(), 4, "served page, world 16: nodes");
  await checkGroups(page, "tp", [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [10, 11], [12, 13], [14, 15]]);
  await checkCharts(page, 2, "served page, world 16");
  await page.screenshot({ path: path.join(ARTIFACTS, "plan_serve.png"), fullPage: true });

  // TP 3: 8 heads are not divisible by 3, 16 GPUs not by TP x PP = 6.
  await setInput(page, "tensor-model-parallel-size", 3);
  await page.waitForSelector("#errors li", { timeout: STEP_MS });
  await page.waitForFunction(() => document.body.dataset.valid === "0", null, { timeout: STEP_MS });
  const errors = await page.locator("#errors li").allTextContents();
  check(errors.some((t) => t.includes("--tensor-model-parallel-size")),
        "served page, TP 3: no error names --tensor-model-parallel-size:\n  " + errors.join("\n  "));
  await checkBadge(page, false, "served page, TP 3");
  checkEq(await gpuCount(page), 0, "served page, TP 3: GPU cells drawn for an invalid plan");
  await page.screenshot({ path: path.join(ARTIFACTS, "plan_serve_invalid.png"), fullPage: true });

  // And back: the page recovers.
  await setInput(page, "tensor-model-parallel-size", 2);
  await page.waitForFunction(() => document.body.dataset.valid === "1", null, { timeout: STEP_MS });
  checkEq(await gpuCount(page), 16, "served page, TP back to 2: GPU cells");
  checkEq(await page.locator("#errors li").count(), 0, "served page, TP back to 2: error items");

  // A request-level error (no flag list, the flag is in the message) reads cleanly.
  await setInput(page, "world-size", "1.5");
  await page.waitForFunction(() => document.body.dataset.valid === "0", null, { timeout: STEP_MS });
  const parse = await page.locator("#errors li").allTextContents();
  check(parse.length > 0 && parse.every((t) => !t.startsWith(":")) && parse.some((t) => t.includes("--world-size")),
        "served page, world-size 1.5: expected a clean error naming --world-size, got:\n  " + parse.join("\n  "));
  check(await page.locator("#summary").isHidden(), "served page, invalid plan: the empty summary box is shown");
  await setInput(page, "world-size", 16);
  await page.waitForFunction(() => document.body.dataset.valid === "1", null, { timeout: STEP_MS });
  checkEq(await gpuCount(page), 16, "served page, world-size back to 16: GPU cells");

  // A step batch schedule (--step-batch-size-schedule; the global batch field
  // cleared first, as the two exclude each other): the plan holds the
  // largest batch the run reaches, 16 x 512 tokens passing 1K.
  const cleared = page.waitForResponse((r) => r.url().endsWith("/api/plan"));
  await page.locator('#plan-form [name="global-batch-size"]').fill("");
  await page.locator('#plan-form [name="global-batch-size"]').press("Tab");
  await cleared;
  await setInput(page, "step-batch-size-schedule", "0:8 1K:16");
  await page.waitForFunction(() => document.body.dataset.valid === "1", null, { timeout: STEP_MS })
    .catch(async () => { throw new TestFailure("served page, step schedule: invalid plan:\n  " +
                                               (await page.locator("#errors li").allTextContents()).join("\n  ")); });
  const summary = await page.locator("#summary").textContent();
  check(summary.includes("= 16"), `served page, step schedule: the global batch card lacks '= 16': ${summary}`);

  // Multi-latent attention: the checkbox, then its q rank; the planner's
  // parameter count changes with each (the summary shows it).
  const params = async () => (await page.locator("#summary").textContent());
  const before = await params();
  const mlaOn = page.waitForResponse((r) => r.url().endsWith("/api/plan"));
  await page.locator('#plan-form [name="multi-latent-attention"]').check();
  const mlaBody = (await mlaOn.then((r) => r.request())).postDataJSON();
  check(mlaBody.args.includes("--multi-latent-attention"),
        `served page, MLA: the page posted args without --multi-latent-attention: ${JSON.stringify(mlaBody.args)}`);
  await page.waitForFunction((b) => document.body.dataset.valid === "1" && document.querySelector("#summary").textContent !== b,
                             before, { timeout: STEP_MS })
    .catch(async () => { throw new TestFailure("served page, MLA: no new valid plan:\n  " +
                                               (await page.locator("#errors li").allTextContents()).join("\n  ")); });
  await setInput(page, "q-lora-rank", 64);
  await page.waitForFunction(() => document.body.dataset.valid === "1", null, { timeout: STEP_MS });

  // Multi-token prediction: one MTP layer with learned positions is refused
  // (Megatron's rule, named on the page); with RoPE the plan is valid again
  // and counts the MTP layer's parameters.
  await setInput(page, "mtp-num-layers", 1);
  await page.waitForFunction(() => document.body.dataset.valid === "0", null, { timeout: STEP_MS })
    .catch(() => { throw new TestFailure("served page, MTP: learned positions with --mtp-num-layers not refused"); });
  const mtpErrors = (await page.locator("#errors li").allTextContents()).join("\n");
  check(mtpErrors.includes("--mtp-num-layers") && mtpErrors.includes("rope"),
        `served page, MTP: the error does not name --mtp-num-layers and the fix: ${mtpErrors}`);
  const withRope = page.waitForResponse((r) => r.url().endsWith("/api/plan"));
  await page.locator('#plan-form [name="position-embedding-type"]').selectOption("rope");
  const ropeBody = (await withRope.then((r) => r.request())).postDataJSON();
  check(ropeBody.args.join(" ").includes("--mtp-num-layers 1") &&
        ropeBody.args.join(" ").includes("--position-embedding-type rope"),
        `served page, MTP: posted args ${JSON.stringify(ropeBody.args)}`);
  await page.waitForFunction(() => document.body.dataset.valid === "1", null, { timeout: STEP_MS })
    .catch(async () => { throw new TestFailure("served page, MTP with RoPE: no valid plan:\n  " +
                                               (await page.locator("#errors li").allTextContents()).join("\n  ")); });

  const foreign = w.requests.filter((u) => !u.startsWith(server.url));
  checkEq(foreign, [], "served page: requests to anything but the server");
  checkNoProblems(w);
  await page.close();
  log("served page: ok");
}

async function api(server) {
  const bad = await postPlan(server.url, "not json");
  check(bad.type.includes("application/json"), `POST 'not json': content type ${bad.type}, not JSON`);
  check(bad.json.valid === false, `POST 'not json': expected valid=false, got ${JSON.stringify(bad.json)}`);
  check(Array.isArray(bad.json.errors) && bad.json.errors.length > 0 && bad.json.errors[0].message,
        `POST 'not json': expected an error message, got ${JSON.stringify(bad.json)}`);

  const abc = await postPlan(server.url, JSON.stringify({ args: ["--tensor-model-parallel-size", "abc"] }));
  check(abc.type.includes("application/json"), `POST tp=abc: content type ${abc.type}, not JSON`);
  check(abc.json.valid === false, `POST tp=abc: expected valid=false, got ${JSON.stringify(abc.json)}`);
  const names = (e) => (e.flags || []).includes("--tensor-model-parallel-size") ||
                       String(e.message).includes("--tensor-model-parallel-size");
  check((abc.json.errors || []).some(names),
        `POST tp=abc: no error names --tensor-model-parallel-size: ${JSON.stringify(abc.json.errors)}`);

  // Still alive and still planning.
  check(server.proc.exitCode === null && server.proc.signalCode === null, "the server exited after the malformed requests");
  const ok = await postPlan(server.url, JSON.stringify({ args: PLAN_FLAGS }));
  check(ok.status === 200 && ok.json.valid === true,
        `the server does not plan after the malformed requests: HTTP ${ok.status} ${JSON.stringify(ok.json).slice(0, 300)}`);
  const page = await fetch(server.url, { signal: AbortSignal.timeout(STEP_MS) });
  check(page.status === 200 && (await page.text()).includes("plan-form"), "the server no longer serves the page");
  log("api: ok");
}

let browser = null, server = null, failed = false;
try {
  browser = await chromium.launch({ executablePath: CHROMIUM, headless: true, args: LAUNCH_ARGS });
  await staticPage(browser);
  server = await startServer(["plan", ...PLAN_FLAGS, "--serve", "0"]);
  log(`server on ${server.url}`);
  await servedPage(browser, server);
  await api(server);
} catch (e) {
  failed = true;
  console.error("FAIL: " + (e instanceof TestFailure ? e.message : (e && e.stack) || e));
} finally {
  if (browser) await browser.close().catch(() => {});
  if (server) await stopServer(server.proc).catch(() => {});
}
if (failed) process.exit(1);
log(`PASS (screenshots in ${ARTIFACTS})`);
process.exit(0);
