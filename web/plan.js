// The plan page: draws a PlanReport (JSON from `megatron plan`) and, when
// served by `megatron plan --serve`, re-asks the C++ planner at /api/plan on
// every change. The browser never re-implements a rule: it only draws.
(function () {
  "use strict";
  const $ = (sel) => document.querySelector(sel);
  const SVG = "http://www.w3.org/2000/svg";
  const GIB = 1024 * 1024 * 1024;
  let current = null;

  function el(tag, attrs, text) {
    const e = tag.startsWith("svg:") ? document.createElementNS(SVG, tag.slice(4)) : document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    return e;
  }
  const fmtInt = (x) => Math.round(x).toLocaleString("en-US");
  const fmtGiB = (b) => (b / GIB).toFixed(2) + " GiB";
  // Twelve well-separated colours first, then golden-angle hues at alternating lightness.
  const PALETTE = ["#4e79a7", "#e15759", "#59a14f", "#f28e2b", "#b07aa1", "#76b7b2",
                   "#edc948", "#9c755f", "#ff9da7", "#17becf", "#8c564b", "#bcbd22"];
  const groupColor = (i) => i < PALETTE.length ? PALETTE[i]
      : `hsl(${(i * 137.508) % 360}, 62%, ${i % 2 ? 40 : 55}%)`;

  // ---- form <-> flags
  function fillForm(form) {
    const f = $("#plan-form");
    for (const [k, v] of Object.entries(form || {})) {
      const input = f.elements[k];
      if (!input) continue;
      if (input.type === "checkbox") input.checked = !!v;
      else input.value = (v === 0 && (k === "global-batch-size" || k === "ffn-hidden-size" || k === "q-lora-rank")) ? "" : v;
    }
  }
  function formArgs() {
    const f = $("#plan-form");
    const args = [];
    const num = (name) => f.elements[name].value.trim();
    for (const name of ["world-size", "tensor-model-parallel-size", "pipeline-model-parallel-size",
                        "context-parallel-size", "expert-model-parallel-size", "gpus-per-node",
                        "num-layers", "hidden-size", "num-attention-heads", "seq-length",
                        "max-position-embeddings", "vocab-size", "micro-batch-size"]) {
      if (num(name) !== "") args.push("--" + name, num(name));
    }
    for (const name of ["ffn-hidden-size", "global-batch-size", "num-experts", "mtp-num-layers"]) {
      if (num(name) !== "" && Number(num(name)) > 0) args.push("--" + name, num(name));
    }
    const sched = num("step-batch-size-schedule");
    if (sched !== "") args.push("--step-batch-size-schedule", sched);
    if (f.elements["optimizer"].value !== "adam") args.push("--optimizer", f.elements["optimizer"].value);
    const pos = f.elements["position-embedding-type"].value;
    if (pos !== "learned_absolute") args.push("--position-embedding-type", pos);
    const v = num("num-virtual-stages-per-pipeline-rank");
    if (v !== "" && Number(v) > 1) args.push("--num-virtual-stages-per-pipeline-rank", v);
    const g = num("num-query-groups");
    if (g !== "" && Number(g) > 0) args.push("--group-query-attention", "--num-query-groups", g);
    for (const name of ["swiglu", "untie-embeddings-and-output-weights", "sequence-parallel", "use-distributed-optimizer"]) {
      if (f.elements[name].checked) args.push("--" + name);
    }
    // Multi-latent attention: its ranks count only with it (Megatron ignores them otherwise).
    if (f.elements["multi-latent-attention"].checked) {
      args.push("--multi-latent-attention");
      for (const name of ["q-lora-rank", "kv-lora-rank"])
        if (num(name) !== "" && Number(num(name)) > 0) args.push("--" + name, num(name));
    }
    const prec = f.elements["precision"].value;
    if (prec !== "fp32") args.push("--" + prec);
    const rc = f.elements["recompute"].value;
    if (rc === "selective") args.push("--recompute-granularity", "selective");
    if (rc === "full") args.push("--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1");
    args.push("--device", f.elements["device"].value);
    if (num("step-time") !== "") args.push("--step-time", num("step-time"));
    return args;
  }

  // ---- sections
  function drawMessages(plan) {
    const errs = $("#errors"), warns = $("#warnings");
    errs.replaceChildren();
    warns.replaceChildren();
    for (const e of plan.errors || []) {
      const li = el("li", { class: "error" });
      const flags = (e.flags || []).join(", ");
      if (flags) li.append(el("b", {}, flags), document.createTextNode(": "));
      li.append(document.createTextNode(e.message));
      if (e.suggestion) li.append(el("span", { class: "fix" }, "fix: " + e.suggestion));
      errs.append(li);
    }
    for (const w of plan.warnings || []) warns.append(el("li", {}, w));
    const st = $("#status");
    st.textContent = plan.valid ? "valid" : `invalid (${plan.errors.length})`;
    st.className = "badge " + (plan.valid ? "valid" : "invalid");
  }

  function drawSummary(plan) {
    const s = $("#summary");
    s.replaceChildren();
    if (!plan.valid) return;
    const L = plan.layout, B = plan.batch, M = plan.memory, C = plan.compute, P = plan.pipeline;
    const cards = [
      ["TP x PP x CP x DP", `${L.tp} x ${L.pp} x ${L.cp} x ${L.dp}`],
      ["world", `${L.world} (${L.num_nodes} node${L.num_nodes > 1 ? "s" : ""})`],
      ["global batch", `${B.micro_batch_size} x ${L.dp} x ${B.num_microbatches} = ${B.global_batch_size}`],
      ["parameters", (plan.model.total_params / 1e9).toFixed(2) + " B"],
      ["peak memory / rank", fmtGiB(M.peak_bytes) + (M.fits ? " (fits)" : " (does not fit)")],
      ["bubble", L.pp > 1 ? `${P.bubble_formula.toFixed(3)} (sim ${P.bubble_simulated.toFixed(3)})` : "0"],
      ["tokens/s", fmtInt(C.tokens_per_s) + (C.measured ? "" : " (pred.)")],
      ["MFU", (C.mfu * 100).toFixed(1) + "%"],
    ];
    for (const [k, v] of cards) {
      const c = el("div", { class: "card" });
      c.append(el("div", { class: "k" }, k), el("div", { class: "v" }, v));
      s.append(c);
    }
  }

  function groupIndex(plan, kind) {
    // rank -> index of its group of this kind (undefined if none)
    const idx = new Map();
    const groups = (plan.groups || {})[kind] || [];
    groups.forEach((g, i) => g.forEach((r) => idx.set(r, i)));
    return { idx, groups };
  }

  function drawGrid(plan) {
    const grid = $("#grid");
    grid.replaceChildren();
    if (!plan.valid) return;
    const kind = $("#group-kind").value;
    const { idx, groups } = groupIndex(plan, kind);
    const L = plan.layout;
    const maxCells = 2048;
    const ranks = plan.ranks.slice(0, maxCells);
    const perNode = L.gpus_per_node;
    const nodes = new Map();
    for (const r of ranks) {
      if (!nodes.has(r.node)) {
        const n = el("div", { class: "node" });
        n.append(el("div", { class: "title" }, "node " + r.node));
        const g = el("div", { class: "gpus" });
        g.style.gridTemplateColumns = `repeat(${Math.min(perNode, 8)}, 54px)`;
        n.append(g);
        nodes.set(r.node, g);
        grid.append(n);
      }
      const gi = idx.get(r.rank);
      const cell = el("div", { class: "gpu", "data-rank": r.rank, "data-group": gi === undefined ? "none" : gi });
      cell.style.background = gi === undefined ? "#98a2b3" : groupColor(gi);
      const coords = `tp${r.tp} cp${r.cp} ep${r.ep} dp${r.dp} pp${r.pp}`;
      cell.title = `rank ${r.rank} (node ${r.node}, gpu ${r.gpu}): ${coords}`;
      cell.append(el("div", {}, "r" + r.rank), el("div", { class: "c" }, `t${r.tp} d${r.dp} p${r.pp}`));
      const show = () => {
        const members = gi === undefined ? [] : groups[gi];
        $("#rank-info").textContent =
          `rank ${r.rank} on node ${r.node}, GPU ${r.gpu}: ${coords}; ${kind} group ${gi === undefined ? "(none)" : "[" + members.join(", ") + "]"}`;
      };
      cell.addEventListener("mouseenter", show);
      cell.addEventListener("click", () => {
        show();
        const members = new Set(gi === undefined ? [r.rank] : groups[gi]);
        for (const c of grid.querySelectorAll(".gpu")) {
          const inGroup = members.has(Number(c.dataset.rank));
          c.classList.toggle("sel", inGroup);
          c.classList.toggle("dim", !inGroup);
        }
      });
      nodes.get(r.node).append(cell);
    }
    if (plan.ranks.length > maxCells || plan.ranks_truncated)
      grid.append(el("div", { class: "note" }, `showing the first ${ranks.length} of ${L.world} GPUs`));
  }

  function drawMemory(plan) {
    const box = $("#memory");
    box.replaceChildren();
    $("#memory-notes").textContent = "";
    if (!plan.valid) return;
    const M = plan.memory;
    const parts = [["param_bytes", "weights", "#4e79a7"], ["grad_bytes", "gradients", "#f28e2b"],
                   ["optimizer_bytes", "optimizer", "#e15759"], ["activation_bytes", "activations", "#76b7b2"],
                   ["transient_bytes", "transient", "#59a14f"], ["reserve_bytes", "runtime reserve", "#bab0ac"]];
    // Scale to the device unless the ranks use under a quarter of it; then
    // scale to the largest rank so the parts stay readable.
    const largest = Math.max(...M.stages.map((s) => s.total_bytes));
    const deviceOnScale = largest * 4 >= M.device_bytes;
    const maxBytes = deviceOnScale ? Math.max(M.device_bytes, largest) : largest;
    const W = 760, left = 70, barH = 22, gap = 8, top = 24;
    const H = top + M.stages.length * (barH + gap) + 40;
    const svg = el("svg:svg", { width: W, height: H, id: "memory-svg" });
    const x = (b) => left + (b / maxBytes) * (W - left - 20);
    M.stages.forEach((s, i) => {
      const y = top + i * (barH + gap);
      svg.append(el("svg:text", { x: 4, y: y + 15 }, "stage " + s.pp_rank));
      let acc = 0;
      for (const [key, label, color] of parts) {
        const v = s[key];
        if (v <= 0) continue;
        const r = el("svg:rect", { x: x(acc), y, width: Math.max(0.5, x(acc + v) - x(acc)), height: barH, fill: color, class: "mem-part" });
        r.append(el("svg:title", {}, `stage ${s.pp_rank} ${label}: ${fmtGiB(v)}`));
        svg.append(r);
        acc += v;
      }
      svg.append(el("svg:text", { x: x(acc) + 4, y: y + 15 }, fmtGiB(s.total_bytes)));
    });
    if (deviceOnScale) {
      const dx = x(M.device_bytes);
      svg.append(el("svg:line", { x1: dx, x2: dx, y1: 10, y2: H - 30, stroke: "#b42318", "stroke-dasharray": "4 3", class: "device-line" }));
      svg.append(el("svg:text", { x: Math.min(dx - 60, W - 140), y: 12, fill: "#b42318" }, `${M.device}: ${fmtGiB(M.device_bytes)}`));
    } else {
      svg.append(el("svg:text", { x: left, y: 12, fill: "#b42318" },
                    `${M.device}: ${fmtGiB(M.device_bytes)} (off scale: the busiest rank uses ${(100 * largest / M.device_bytes).toFixed(1)}%)`));
    }
    let lx = left;
    for (const [, label, color] of parts) {
      svg.append(el("svg:rect", { x: lx, y: H - 22, width: 10, height: 10, fill: color }));
      svg.append(el("svg:text", { x: lx + 14, y: H - 13 }, label));
      lx += 18 + label.length * 6.5;
    }
    box.append(svg);
    const notes = [];
    if (M.megatron) {
      const mb = (b) => (b / 1048576).toFixed(2);
      notes.push(`Megatron's estimate: weight and optimizer=${mb(M.megatron.weight_and_optimizer_bytes)} MB, ` +
                 `activation=${mb(M.megatron.activation_bytes)} MB, total=${mb(M.megatron.total_bytes)} MB.`);
    }
    for (const f of M.fit_options || []) notes.push(`${f.fits ? "fits" : "does not fit"} (${fmtGiB(f.peak_bytes)}): ${f.options}`);
    notes.push(`Model state ${(M.model_state_bytes / 1e9).toFixed(1)} GB (${M.model_state_bytes_per_param} bytes/parameter); checkpoint ${(M.checkpoint_bytes / 1e9).toFixed(1)} GB.`);
    const n = $("#memory-notes");
    for (const t of notes) n.append(el("div", {}, t));
  }

  function drawTimeline(plan) {
    const box = $("#timeline");
    box.replaceChildren();
    $("#timeline-notes").textContent = "";
    if (!plan.valid) return;
    const P = plan.pipeline, T = P.timeline;
    if (!T || !T.ranks || T.ranks.length === 0) return;
    const W = 900, left = 56, rowH = 26, top = 8;
    const H = top + T.ranks.length * rowH + 10;
    const scale = (W - left - 10) / T.makespan;
    const svg = el("svg:svg", { width: W, height: H, id: "timeline-svg" });
    const M = T.microbatches;
    T.ranks.forEach((acts, r) => {
      const y = top + r * rowH;
      svg.append(el("svg:text", { x: 2, y: y + 16 }, "stage " + r));
      // idle background: whatever is not covered by an action is bubble
      svg.append(el("svg:rect", { x: left, y, width: T.makespan * scale, height: rowH - 4, fill: "#eceef2", class: "idle" }));
      for (const [op, mb, chunk, start, end] of acts) {
        const hue = (mb * 360) / Math.max(1, M);
        const fill = op === "F" ? `hsl(${hue},70%,72%)` : `hsl(${hue},60%,42%)`;
        const rect = el("svg:rect", { x: left + start * scale, y, width: Math.max(0.5, (end - start) * scale - 0.5), height: rowH - 4,
                                      fill, class: op === "F" ? "fwd" : "bwd" });
        rect.append(el("svg:title", {}, `${op === "F" ? "forward" : "backward"} micro-batch ${mb}, chunk ${chunk}: ${start.toFixed(2)}-${end.toFixed(2)}`));
        svg.append(rect);
        if ((end - start) * scale > 14)
          svg.append(el("svg:text", { x: left + start * scale + 2, y: y + 15, fill: op === "F" ? "#111" : "#fff" }, String(mb)));
      }
    });
    box.append(svg);
    const L = plan.layout;
    $("#timeline-notes").textContent =
      `${P.schedule}, PP ${L.pp}, virtual stages ${L.vpp}, drawn with ${M} of ${plan.batch.num_microbatches} micro-batches ` +
      `(backward = 2 x forward; grey = idle). Bubble: formula ${P.bubble_formula.toFixed(3)}, simulated ${P.bubble_simulated.toFixed(3)}.`;
  }

  function draw(plan) {
    current = plan;
    drawMessages(plan);
    drawSummary(plan);
    drawGrid(plan);
    drawMemory(plan);
    drawTimeline(plan);
    document.body.dataset.valid = plan.valid ? "1" : "0";
  }

  let pending = null;
  async function replan() {
    const args = formArgs();
    const ticket = {};
    pending = ticket;
    try {
      const res = await fetch("/api/plan", { method: "POST", headers: { "Content-Type": "application/json" },
                                             body: JSON.stringify({ args }) });
      const plan = await res.json();
      if (pending === ticket) draw(plan);
    } catch (e) {
      $("#errors").replaceChildren(el("li", {}, "the planner did not answer: " + e));
    }
  }

  $("#group-kind").addEventListener("change", () => current && drawGrid(current));
  const form = $("#plan-form");
  if (SERVE_MODE) {
    $("#mode-note").textContent = "live: every change re-asks the C++ planner";
    form.addEventListener("submit", (e) => { e.preventDefault(); replan(); });
    form.addEventListener("change", () => replan());
  } else {
    $("#mode-note").textContent = "static page: run `megatron plan --serve PORT` to edit";
    for (const e of form.elements) e.disabled = true;
    form.addEventListener("submit", (e) => e.preventDefault());
  }
  fillForm(PLAN.form);
  draw(PLAN);
})();
