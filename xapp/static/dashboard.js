// Weaver operator dashboard: polls the xApp's REST API (/api/v1/...) every second and draws one chart
// per site on a canvas; above CARD_LIMIT sites it shows a table of every site, worst first, and charts
// only the sites an operator opens from it (one series request a poll per open site, not per site: at
// 1,000 sites a chart each would be 1,000 requests a second into the xApp's event loop). No build step,
// no library. Every field is treated as optional: a missing field shows "-", a failed fetch shows "xApp
// unreachable" and the next poll retries; data already drawn stays on screen. Stable hooks for tests:
// data-testid / data-site / data-status attributes.
"use strict";

(() => {
  const POLL_MS = 1000;
  const FETCH_TIMEOUT_MS = 3000;
  const LOST_AFTER_S = 3;          // no KPM for this long (or 5 staleness limits, if longer): "lost"
  const CARD_LIMIT = 12;           // more reported sites than this: the summary table, charts on demand
  const TABLE_ROWS = 50;           // summary rows shown (worst first); the filter finds any other site
  const STATUS_RANK = { lost: 0, stale: 1, waiting: 2, live: 3 };
  const COLORS = { demand: "#1565c0", peak: "#90caf9", envelope: "#ef6c00", grant: "#2e7d32",
                   used: "#00bfa5", miss: "#c62828", stale: "#e0e0e0", gap: "#f3f3f3",
                   grid: "#eceff3", axis: "#667" };

  const S = {
    periodS: 0.1, staleS: 0.2, historyMin: 10, heartbeatS: 3, epoch: null,
    skewS: 0,                      // browser clock minus xApp clock (from the HTTP Date header)
    sites: new Map(),              // site id -> SiteTrack
    agentsSeen: new Map(),         // site id -> last agent row (kept after it disappears, shown "lost")
    drill: new Set(),              // summary mode: the sites opened from the table (charted)
    configAt: -Infinity,
    failures: 0, lastOkS: null,
  };

  // ---------------------------------------------------------------- small helpers
  const $ = (id) => document.getElementById(id);
  const isNum = (v) => typeof v === "number" && Number.isFinite(v);
  const fmt = (v, digits = 0) => (isNum(v) ? v.toFixed(digits) : "-");
  const nowS = () => Date.now() / 1000 - S.skewS;          // "now" on the xApp's clock

  function el(tag, attrs = {}, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs)) {
      if (k === "class") e.className = v;
      else if (k.startsWith("data-")) e.setAttribute(k, v);
      else e[k] = v;
    }
    for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
    return e;
  }

  function ago(s) {
    if (!isNum(s)) return "-";
    if (s < 1) return `${Math.round(s * 1000)} ms`;
    if (s < 120) return `${s.toFixed(1)} s`;
    return `${Math.round(s / 60)} min`;
  }

  function bytes(n) {
    if (!isNum(n)) return "-";
    const u = ["B", "kB", "MB", "GB", "TB"];
    let i = 0;
    while (n >= 1000 && i < u.length - 1) { n /= 1000; i += 1; }
    return `${n.toFixed(i ? 1 : 0)} ${u[i]}`;
  }

  async function getJson(path) {
    const ctl = new AbortController();
    const timer = setTimeout(() => ctl.abort(), FETCH_TIMEOUT_MS);
    try {
      const r = await fetch(path, { signal: ctl.signal, cache: "no-store" });
      const date = Date.parse(r.headers.get("Date") || "");
      if (isNum(date)) S.skewS = 0.8 * S.skewS + 0.2 * (Date.now() - date) / 1000;
      if (!r.ok) throw new Error(`${path}: HTTP ${r.status}`);
      return await r.json();
    } finally {
      clearTimeout(timer);
    }
  }

  // ---------------------------------------------------------------- per-site data
  class SiteTrack {
    constructor(id) {
      this.id = id;
      this.view = {};              // last /api/v1/sites entry
      this.points = [];            // series points {t, envelope_sms, grant_sms, demand_mean_sms, demand_peak_sms, fresh}
      this.used = [];              // {t, v}: SMs the agent used, one per usage report we saw
      this.misses = [];            // {t, n}: deadline misses the node reported in that interval
      this.lastMisses = null;
      this.lastUsageT = null;
      this.everFresh = false;
      this.reported = true;        // present in the last /api/v1/sites answer
      this.status = "waiting";
      this.why = "";
      this.card = null;
    }

    lastT() { return this.points.length ? this.points[this.points.length - 1].t : null; }

    merge(points) {
      const last = this.lastT();
      for (const p of points || []) {
        if (p && isNum(p.t) && (last === null || p.t > last)) this.points.push(p);
      }
      this.prune();
    }

    prune() {
      const keep = nowS() - S.historyMin * 60;
      const cut = (arr) => { let i = 0; while (i < arr.length && arr[i].t < keep) i += 1; if (i) arr.splice(0, i); };
      cut(this.points); cut(this.used); cut(this.misses);
    }

    update(view) {
      this.view = view || {};
      this.reported = true;
      const t = nowS();
      const misses = this.view.misses_reported;
      if (isNum(misses)) {
        if (isNum(this.lastMisses) && misses > this.lastMisses) this.misses.push({ t, n: misses - this.lastMisses });
        this.lastMisses = misses;
      }
      const u = this.view.usage;
      if (u && isNum(u.age_s)) {
        const ut = t - u.age_s;
        if (this.lastUsageT === null || ut > this.lastUsageT + 1e-3) {
          const v = usedSms(this.view);
          if (isNum(v)) this.used.push({ t: ut, v });
          this.lastUsageT = ut;
        }
      }
      if (this.view.fresh) this.everFresh = true;
    }

    kpmAge() {
      const ages = Object.values(this.view.kpm_age_s || {}).filter(isNum);
      return ages.length ? Math.max(...ages) : null;
    }

    classify() {
      const age = this.kpmAge();
      const lostAfter = Math.max(LOST_AFTER_S, 5 * S.staleS);
      if (!this.reported) return ["lost", "no longer reported by the xApp"];
      if (age === null) return this.everFresh ? ["lost", "no KPM"] : ["waiting", "waiting for KPM"];
      if (age > lostAfter) return ["lost", `no KPM for ${ago(age)}${this.view.reason ? ` (${this.view.reason})` : ""}`];
      if (!this.view.fresh) return ["stale", this.view.reason || `KPM ${ago(age)} old`];
      return ["live", this.view.reason || ""];
    }
  }

  function usedSms(view) {
    // SMs the agent used over its last report window: the xApp's own figure when it gives one, else
    // the lease size scaled by the used/granted SM-time of that report.
    const u = view.usage || {};
    if (isNum(u.used_sms)) return u.used_sms;
    const size = view.lease && isNum(view.lease.sm_count) ? view.lease.sm_count : view.grant_sms;
    if (!isNum(u.sm_ms_used) || !isNum(u.sm_ms_granted) || !isNum(size)) return null;
    return u.sm_ms_granted > 0 ? size * Math.min(1, u.sm_ms_used / u.sm_ms_granted) : 0;
  }

  function tokensPerS(usage) {
    if (!usage) return null;
    if (isNum(usage.tokens_per_s)) return usage.tokens_per_s;
    if (!isNum(usage.tokens)) return null;
    const windowS = isNum(usage.window_ms) && usage.window_ms > 0 ? usage.window_ms / 1000 : S.periodS;
    return usage.tokens / windowS;
  }

  // ---------------------------------------------------------------- site cards
  function buildCard(track) {
    const canvas = el("canvas", { "data-testid": "site-chart", "data-site": track.id, "data-points": "0" });
    const kv = el("div", { class: "kv", "data-testid": "site-kv" });
    const caps = el("div", { class: "caps", "data-testid": "site-caps" });
    // the utilisation waterfall (GET /api/v1/waterfall): usable spare -> granted -> held -> used
    const wf = el("canvas", { class: "waterfall", "data-testid": "site-waterfall", "data-site": track.id, "data-stages": "0" });
    const wfText = el("div", { class: "wf-text", "data-testid": "site-waterfall-causes" });
    const badge = el("span", { class: "badge waiting", "data-testid": "site-status" }, "waiting");
    const why = el("span", { class: "why", "data-testid": "site-why" });
    const card = el("div", { class: "site", "data-testid": "site-card", "data-site": track.id, "data-status": "waiting" },
      el("h3", {}, el("span", { "data-testid": "site-name" }, track.id), why, badge), canvas, kv, wf, wfText, caps);
    track.card = { root: card, canvas, kv, caps, badge, why, wf, wfText };
    const host = $("sites");
    host.querySelector(".empty")?.remove();
    const after = [...host.children].find((c) => c.dataset.site > track.id);
    host.insertBefore(card, after || null);
  }

  function safetyItems(sf) {
    // What the grant rests on (an enforced envelope, or only the policy's forecast) and the RAN-first
    // rule's slack; a conservative hold (deadline miss, control failure) is shown with its reason.
    if (!sf || typeof sf !== "object") return [];
    const slack = isNum(sf.slack_sms) ? `${sf.slack_sms} SMs` : "-";
    const hold = isNum(sf.conservative_for_s) && sf.conservative_for_s > 0
      ? `${sf.conservative_reason || "hold"} ${fmt(sf.conservative_for_s, 1)} s` : (sf.lifted ? "lifted" : "none");
    return [...kvItem("grant basis", String(sf.basis || "-"), sf.basis === "forecast"),
      ...kvItem("RAN-first slack", slack, isNum(sf.slack_sms) && sf.slack_sms < 0),
      ...kvItem("conservative", hold, isNum(sf.conservative_for_s) && sf.conservative_for_s > 0)];
  }

  // What the site's decisions rest on (xapp.inputs): offered demand measured by the node, estimated from
  // standard PRB / GPU counters through the cost model, or none; the best-effort backlog guard runs only
  // on a measured delay.
  function inputsText(p) {
    if (!p || typeof p !== "object") return "-";
    const i = p.inputs && typeof p.inputs === "object" ? p.inputs : {};
    const be = i.be_delay_ms === "measured" ? "BE guard on" : "BE guard off";
    return p.basis === "estimated" ? `estimated from ${p.demand === "model" ? "PRBs" : "GPU counters"}, ${be}`
      : `${p.basis || "none"}${p.basis === "measured" ? `, ${be}` : ""}`;
  }

  function kvItem(label, value, bad = false) {
    return [el("span", {}, label), el("b", bad ? { class: "bad" } : {}, value)];
  }

  function dropCard(track) {
    if (!track.card) return;
    track.card.root.remove();
    track.card = null;
  }

  // ---------------------------------------------------------------- the summary table (many sites)
  const summaryMode = () => [...S.sites.values()].filter((t) => t.reported).length > CARD_LIMIT;

  function classifyAll() {
    for (const t of S.sites.values()) [t.status, t.why] = t.classify();
  }

  function worstFirst(a, b) {
    const va = a.view, vb = b.view;
    const slack = (v) => (v.safety && isNum(v.safety.slack_sms) ? v.safety.slack_sms : Infinity);
    const misses = (v) => (isNum(v.misses_reported) ? v.misses_reported : 0);
    return (STATUS_RANK[a.status] ?? 9) - (STATUS_RANK[b.status] ?? 9) || misses(vb) - misses(va)
      || slack(va) - slack(vb) || (b.kpmAge() ?? -1) - (a.kpmAge() ?? -1) || (a.id < b.id ? -1 : a.id > b.id ? 1 : 0);
  }

  function renderSiteTable() {
    const box = $("site-summary");
    const on = summaryMode();
    box.hidden = !on;
    document.body.dataset.view = on ? "summary" : "cards";
    if (!on) { S.drill.clear(); return; }
    const all = [...S.sites.values()].sort(worstFirst);
    const q = $("site-filter").value.trim();
    const shown = (q ? all.filter((t) => t.id.includes(q)) : all).slice(0, TABLE_ROWS);
    const count = {};
    for (const t of all) count[t.status] = (count[t.status] || 0) + 1;
    $("summary-count").textContent = `${all.length} sites: ${["lost", "stale", "waiting", "live"]
      .filter((k) => count[k]).map((k) => `${count[k]} ${k}`).join(", ")}; showing ${shown.length}${q ? ` matching "${q}"` : ", worst first"}`;
    $("site-rows").replaceChildren(...shown.map((t) => {
      const v = t.view;
      const slack = v.safety && isNum(v.safety.slack_sms) ? v.safety.slack_sms : null;
      const row = el("tr", { "data-testid": "summary-row", "data-site": t.id, "data-status": t.status,
                             "data-drilled": S.drill.has(t.id) ? "1" : "0" },
        el("td", {}, t.id), el("td", {}, t.status), el("td", { title: t.why }, t.why.slice(0, 60)), el("td", {}, ago(t.kpmAge())),
        el("td", {}, fmt(v.demand_mean_sms, 1)), el("td", {}, fmt(v.envelope_sms)), el("td", {}, fmt(v.grant_sms)),
        el("td", {}, fmt(v.misses_reported)), el("td", {}, fmt(slack)), el("td", {}, v.agent || "none"));
      row.addEventListener("click", () => toggleDrill(t));
      return row;
    }));
  }

  function toggleDrill(track) {
    if (S.drill.has(track.id)) {
      S.drill.delete(track.id);
      dropCard(track);
    } else {
      S.drill.add(track.id);
      renderCard(track);
      fetchSeries(track).then(() => drawChart(track)).catch(() => null);
    }
    renderSiteTable();
  }

  function renderCard(track) {
    if (!track.card) buildCard(track);
    const v = track.view;
    const c = track.card;
    const [status, why] = track.classify();
    track.status = status;
    c.root.dataset.status = status;
    c.badge.className = `badge ${status}`;
    c.badge.textContent = status;
    c.why.textContent = why;
    c.why.title = why;

    const used = track.used.length ? track.used[track.used.length - 1].v : null;
    const lease = v.lease && isNum(v.lease.sm_count) ? `${v.lease.sm_count} (#${v.lease.seq ?? "-"})` : "none";
    const env = isNum(v.envelope_sms) ? `${v.envelope_sms}${isNum(v.acked_envelope_sms) && v.acked_envelope_sms !== v.envelope_sms ? ` (acked ${v.acked_envelope_sms})` : ""}` : "-";
    const agent = v.agent ? `${v.agent}${v.usage && v.usage.mode ? ` / ${v.usage.mode}` : ""}` : "none";
    c.kv.replaceChildren(
      ...kvItem("demand mean", `${fmt(v.demand_mean_sms, 1)} SMs`), ...kvItem("demand max", `${fmt(v.demand_peak_sms, 0)} SMs`),
      ...kvItem("envelope", `${env} SMs`), ...kvItem("GPU", `${fmt(v.gpu_sms)} SMs / ${fmt(v.granularity)}`),
      ...kvItem("granted", `${fmt(v.grant_sms)} SMs`), ...kvItem("lease", lease),
      ...kvItem("used", `${fmt(used, 1)} SMs`), ...kvItem("misses", fmt(v.misses_reported), isNum(v.misses_reported) && v.misses_reported > 0),
      ...kvItem("KPM age", ago(track.kpmAge()), status === "lost" || status === "stale"), ...kvItem("estimate", v.estimate_source || "-"),
      ...kvItem("policy inputs", inputsText(v.policy_inputs), !!v.policy_inputs && v.policy_inputs.basis !== "measured"),
      ...kvItem("agent", agent), ...kvItem("tokens/s", fmt(tokensPerS(v.usage), 0)),
      ...safetyItems(v.safety),
    );
    const n = v.counters && typeof v.counters === "object" ? v.counters : null;
    if (n) {                   // run totals, when the xApp keeps them
      const util = isNum(n.sm_s_used) && isNum(n.sm_s_granted) && n.sm_s_granted > 0 ? ` (${(100 * n.sm_s_used / n.sm_s_granted).toFixed(1)} %)` : "";
      c.kv.append(
        ...kvItem("SM·s granted", fmt(n.sm_s_granted, 0)), ...kvItem("SM·s used", `${fmt(n.sm_s_used, 1)}${util}`),
        ...kvItem("KPM received", fmt(n.kpm_indications)),
        ...kvItem("RC acked", `${fmt(n.rc_controls_acked)} / ${fmt(n.rc_controls_sent)}${n.rc_controls_failed ? `, ${n.rc_controls_failed} failed` : ""}`),
      );
    }

    const rows = [];
    const nodes = v.nodes && typeof v.nodes === "object" ? v.nodes : {};
    const modes = Object.entries(nodes).map(([m, n]) => `${m}: ${(n && n.mode) || "?"}${n && n.note ? ` (${n.note})` : ""}`);
    for (const cap of Array.isArray(v.caps) ? v.caps : []) {
      if (!Array.isArray(cap) || cap.length < 4) continue;
      const [sst, sd, lo, hi] = cap;
      rows.push(el("tr", { "data-testid": "cap-row" }, el("td", {}, `every cell`), el("td", {}, `SST ${sst} / SD ${sd ?? "-"}`),
        el("td", {}, `min ${fmt(lo)} %`), el("td", {}, `max ${fmt(hi)} %`)));
    }
    c.caps.replaceChildren(
      el("div", {}, `nodes: ${modes.join(", ") || "-"}`),
      rows.length ? el("table", {}, el("tbody", {}, ...rows))
        : el("div", {}, isNum(v.acked_envelope_sms) ? `compute envelope ${v.acked_envelope_sms} SMs (no slice caps)` : "no slice caps acknowledged"),
    );
    drawChart(track);
    drawWaterfall(track);
  }

  // ---------------------------------------------------------------- the waterfall chart
  // One column per stage (SM·s since the xApp started); between two stages, the SM·s lost there stacked
  // by cause (a negative cause, e.g. shaping below the peak, is not drawn but listed).
  const WF_STAGES = ["usable", "granted", "held", "used"];
  const WF_COLORS = ["#8e24aa", "#f9a825", "#6d4c41", "#546e7a", "#d81b60", "#00897b", "#7cb342", "#3949ab"];

  function drawWaterfall(track) {
    const c = track.card, wf = track.waterfall;
    const canvas = c.wf;
    const { g, w, h } = prepCanvas(canvas);
    const st = wf && wf.stages_sm_s && typeof wf.stages_sm_s === "object" ? wf.stages_sm_s : null;
    if (!st || !isNum(st.usable)) { canvas.dataset.stages = "0"; c.wfText.textContent = "waterfall: -"; return; }
    const legs = Array.isArray(wf.legs) ? wf.legs : [];
    const top = Math.max(1e-9, ...WF_STAGES.map((k) => (isNum(st[k]) ? st[k] : 0)));
    const pad = { l: 6, r: 6, t: 14, b: 14 };
    const slot = (w - pad.l - pad.r) / (2 * WF_STAGES.length - 1);
    const Y = (v) => pad.t + (h - pad.t - pad.b) * (1 - Math.max(0, v) / top);
    g.font = "10px system-ui, sans-serif";
    let drawn = 0, causes = 0;
    const colorOf = new Map();
    WF_STAGES.forEach((k, i) => {
      const v = isNum(st[k]) ? st[k] : 0;
      const x = pad.l + 2 * i * slot;
      g.fillStyle = k === "used" ? COLORS.used : k === "granted" ? COLORS.grant : "#78909c";
      g.fillRect(x, Y(v), slot, Y(0) - Y(v));
      g.fillStyle = COLORS.axis;
      g.fillText(`${k} ${Math.round(v)}`, x, h - 3);
      if (st.usable > 0) g.fillText(`${Math.round(100 * v / st.usable)}%`, x, Math.max(10, Y(v) - 3));
      drawn += 1;
      const leg = legs.find((l) => l && l.from === k && l.to === WF_STAGES[i + 1]);
      if (!leg || !leg.causes_sm_s) return;
      let y0 = isNum(st[WF_STAGES[i + 1]]) ? st[WF_STAGES[i + 1]] : 0;
      for (const [cause, lost] of Object.entries(leg.causes_sm_s).sort((a, b) => b[1] - a[1])) {
        if (!isNum(lost) || lost <= 0) continue;
        if (!colorOf.has(cause)) colorOf.set(cause, WF_COLORS[colorOf.size % WF_COLORS.length]);
        g.fillStyle = colorOf.get(cause);
        g.fillRect(x + slot, Y(y0 + lost), slot, Y(y0) - Y(y0 + lost));
        y0 += lost;
        causes += 1;
      }
    });
    canvas.dataset.stages = String(drawn);
    canvas.dataset.causes = String(causes);
    canvas.dataset.usedOverUsable = st.usable > 0 ? (st.used / st.usable).toFixed(3) : "";
    const parts = legs.filter((l) => l && l.causes_sm_s).map((l) => {
      const big = Object.entries(l.causes_sm_s).filter(([, v]) => isNum(v)).sort((a, b) => Math.abs(b[1]) - Math.abs(a[1])).slice(0, 3);
      const lost = isNum(l.lost_sm_s) ? `${l.lost_sm_s >= 0 ? "-" : "+"}${fmt(Math.abs(l.lost_sm_s), 0)}` : "-";
      return `${l.from}>${l.to} ${lost}: ${big.map(([k, v]) => `${k} ${fmt(v, 0)}`).join(", ") || "-"}`;
    });
    const key = (cause, color) => {
      const i = el("i");
      i.style.background = color;
      return el("span", { class: "wf-key", "data-testid": "waterfall-cause" }, i, cause);
    };
    const sup = wf.outside_lease && isNum(wf.outside_lease.supervisor_cpu_s) ? wf.outside_lease.supervisor_cpu_s : null;
    c.wfText.replaceChildren(...[...colorOf].map(([k, col]) => key(k, col)), el("div", {}, `SM·s lost - ${parts.join("; ")}`),
      ...(sup === null ? [] : [el("div", { "data-testid": "waterfall-supervisor" },
        `agent supervisor ${fmt(sup, 1)} CPU·s, outside the lease (bounded apart)`)]));
    canvas.setAttribute("aria-label", `waterfall ${WF_STAGES.map((k) => `${k} ${fmt(st[k], 0)}`).join(" > ")} SM·s`);
  }

  // A canvas sized to its box at the device's pixel ratio, cleared: its context and CSS size.
  function prepCanvas(canvas) {
    const dpr = window.devicePixelRatio || 1;
    const w = Math.max(100, canvas.clientWidth), h = Math.max(60, canvas.clientHeight);
    if (canvas.width !== Math.round(w * dpr) || canvas.height !== Math.round(h * dpr)) {
      canvas.width = Math.round(w * dpr);
      canvas.height = Math.round(h * dpr);
    }
    const g = canvas.getContext("2d");
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    g.clearRect(0, 0, w, h);
    return { g, w, h };
  }

  // ---------------------------------------------------------------- the chart
  function drawChart(track) {
    const canvas = track.card.canvas;
    const { g, w, h } = prepCanvas(canvas);

    const windowS = Number($("window").value || 3) * 60;
    const t1 = nowS(), t0 = t1 - windowS;
    const pad = { l: 34, r: 6, t: 6, b: 16 };
    const pw = w - pad.l - pad.r, ph = h - pad.t - pad.b;
    const pts = track.points.filter((p) => p.t >= t0);
    const used = track.used.filter((p) => p.t >= t0);
    const gpu = isNum(track.view.gpu_sms) ? track.view.gpu_sms : 0;
    let ymax = gpu;
    for (const p of pts) for (const k of ["envelope_sms", "grant_sms", "demand_peak_sms"]) if (isNum(p[k])) ymax = Math.max(ymax, p[k]);
    ymax = ymax > 0 ? ymax : 1;
    const X = (t) => pad.l + ((t - t0) / windowS) * pw;
    const Y = (v) => pad.t + ph - (Math.min(v, ymax) / ymax) * ph;

    // grid and axes
    g.font = "10px system-ui, sans-serif";
    g.fillStyle = COLORS.axis;
    g.strokeStyle = COLORS.grid;
    g.lineWidth = 1;
    for (let i = 0; i <= 4; i += 1) {
      const v = (ymax * i) / 4, y = Y(v);
      g.beginPath(); g.moveTo(pad.l, y); g.lineTo(w - pad.r, y); g.stroke();
      g.fillText(ymax >= 8 ? String(Math.round(v)) : v.toFixed(1), 2, y + 3);
    }
    const stepS = windowS <= 60 ? 15 : 60;
    for (let s = 0; s <= windowS; s += stepS) {
      const x = X(t1 - s);
      g.beginPath(); g.moveTo(x, pad.t); g.lineTo(x, pad.t + ph); g.stroke();
      g.fillText(s ? `-${s >= 60 ? `${s / 60}m` : `${s}s`}` : "now", x - (s ? 10 : 20), h - 3);
    }

    // shaded: periods without fresh KPM, and gaps with no point at all (the site went silent)
    const gapS = Math.max(3 * S.periodS, 0.5);
    let prev = null;
    for (const p of pts) {
      if (prev && p.t - prev.t > gapS) { g.fillStyle = COLORS.gap; g.fillRect(X(prev.t), pad.t, X(p.t) - X(prev.t), ph); }
      if (p.fresh === false) { g.fillStyle = COLORS.stale; g.fillRect(X(prev ? prev.t : p.t - S.periodS), pad.t, Math.max(1, X(p.t) - X(prev ? prev.t : p.t - S.periodS)), ph); }
      prev = p;
    }
    if (prev && t1 - prev.t > gapS) { g.fillStyle = COLORS.stale; g.fillRect(X(prev.t), pad.t, X(t1) - X(prev.t), ph); }

    const line = (arr, key, color, width, step) => {
      g.strokeStyle = color; g.lineWidth = width; g.beginPath();
      let open = false, last = null, n = 0;
      for (const p of arr) {
        const v = p[key];
        if (!isNum(v) || (last && p.t - last.t > gapS)) { open = false; last = isNum(v) ? p : null; if (!isNum(v)) continue; }
        const x = X(p.t), y = Y(v);
        if (!open) { g.moveTo(x, y); open = true; } else if (step) { g.lineTo(x, Y(last[key])); g.lineTo(x, y); } else { g.lineTo(x, y); }
        last = p; n += 1;
      }
      g.stroke();
      return n;
    };
    const nPeak = line(pts, "demand_peak_sms", COLORS.peak, 1, false);
    const nDemand = line(pts, "demand_mean_sms", COLORS.demand, 1.5, false);
    const nEnv = line(pts, "envelope_sms", COLORS.envelope, 1.5, true);
    const nGrant = line(pts, "grant_sms", COLORS.grant, 2, true);
    const nUsed = line(used, "v", COLORS.used, 1.5, true);
    g.fillStyle = COLORS.miss;
    for (const m of track.misses) if (m.t >= t0) g.fillRect(X(m.t) - 1, pad.t, 3, 10);

    canvas.dataset.points = String(nDemand);
    canvas.dataset.peakPoints = String(nPeak);
    canvas.dataset.envelopePoints = String(nEnv);
    canvas.dataset.grantPoints = String(nGrant);
    canvas.dataset.usedPoints = String(nUsed);
  }

  // ---------------------------------------------------------------- tables
  function renderAgents(agents) {
    const now = nowS();
    const live = new Set();
    for (const a of agents) {
      if (!a || typeof a.site_id !== "string") continue;
      live.add(a.site_id);
      S.agentsSeen.set(a.site_id, { ...a, seenAt: now });
    }
    const rows = [];
    for (const [site, a] of [...S.agentsSeen.entries()].sort()) {
      const view = S.sites.get(site)?.view || {};
      const usage = view.usage || null;
      const connected = live.has(site);
      const silent = connected && isNum(a.last_seen_s) && a.last_seen_s > S.heartbeatS;
      const st = !connected ? "lost" : silent ? "silent" : "connected";
      const lastSeen = connected ? a.last_seen_s : now - a.seenAt;
      rows.push(el("tr", { class: st === "connected" ? "" : "lost", "data-testid": "agent-row", "data-site": site, "data-status": st },
        el("td", {}, site), el("td", {}, a.agent_id || "-"), el("td", {}, st),
        el("td", {}, `${a.kind || "-"} / ${(usage && usage.mode) || a.mode || "-"}`),
        el("td", {}, connected && view.lease ? fmt(view.lease.sm_count) : "0"),
        el("td", {}, connected ? fmt(usedSms(view), 1) : "-"),
        el("td", {}, connected ? fmt(tokensPerS(usage), 0) : "-"),
        el("td", {}, usage ? fmt(usage.loss, 3) : "-"),
        el("td", {}, `${ago(lastSeen)} ago`)));
    }
    $("agents").tBodies[0].replaceChildren(...(rows.length ? rows : [el("tr", { class: "empty" }, el("td", { colSpan: 9 }, "no agent connected"))]));
  }

  function renderTransfers(list) {
    const now = nowS();
    const rows = list.filter((x) => x && isNum(x.deadline_unix_ms))
      .sort((a, b) => a.deadline_unix_ms - b.deadline_unix_ms).slice(-30)
      .map((x) => {
        const dt = x.deadline_unix_ms / 1000 - now;
        const when = `${new Date(x.deadline_unix_ms).toLocaleTimeString()} (${dt >= 0 ? "in " + ago(dt) : ago(-dt) + " ago"})`;
        return el("tr", { "data-testid": "transfer-row", "data-site": x.site_id || "" }, el("td", {}, fmt(x.round)),
          el("td", {}, x.site_id || "-"), el("td", {}, fmt(x.workers)), el("td", {}, bytes(x.bytes)), el("td", {}, when));
      });
    $("transfers").tBodies[0].replaceChildren(...(rows.length ? rows : [el("tr", { class: "empty" }, el("td", { colSpan: 5 }, "no transfer planned"))]));
  }

  function renderSubscriptions(doc) {
    // One row per wanted node: active / pending / missing / resubscribing / failed (xapp.subaudit).
    const now = nowS();
    const since = (t) => (isNum(t) ? `${ago(now - t)} ago` : "-");
    const rows = (Array.isArray(doc.subscriptions) ? doc.subscriptions : []).filter((x) => x && typeof x.meid === "string")
      .map((x) => {
        const st = typeof x.state === "string" ? x.state : "?";
        const checked = x.check_error ? `failed: ${x.check_error}` : since(x.last_checked_unix);
        return el("tr", { class: st === "active" ? "" : "lost", "data-testid": "subscription-row", "data-site": x.site_id || "",
          "data-meid": x.meid, "data-state": st },
          el("td", {}, x.site_id || "-"), el("td", {}, x.meid), el("td", { class: `sub-${st}` }, st),
          el("td", {}, since(x.since_unix)), el("td", {}, `${x.subscription_id || "-"} / ${fmt(x.sub_id)}`),
          el("td", {}, checked), el("td", {}, fmt(x.resubscriptions)),
          el("td", {}, isNum(x.kpm_age_s) ? ago(x.kpm_age_s) : "-"), el("td", {}, x.last_error || "-"));
      });
    $("subscriptions").tBodies[0].replaceChildren(...(rows.length ? rows : [el("tr", { class: "empty" }, el("td", { colSpan: 9 }, "no subscription reported yet"))]));
  }

  function controlDetail(c) {
    const parts = [];
    if (isNum(c.envelope_sms)) parts.push(c.kind === "quota" ? `caps sized for E=${c.envelope_sms} SMs` : `envelope ${c.envelope_sms} SMs`);
    for (const q of Array.isArray(c.quotas) ? c.quotas : []) {
      if (Array.isArray(q) && q.length >= 4) parts.push(`slice ${q[0]}/${q[1] ?? "-"}: ${q[2]}-${q[3]} %`);
    }
    return parts.join("; ") || "-";
  }

  function renderControls(list) {
    // The log has one entry when a control is sent and one when it ends (ack / failure ... / timeout).
    const byId = new Map();
    for (const c of list) {
      if (!c || c.control_id === undefined) continue;
      const key = `${c.site}|${c.control_id}`;
      const row = byId.get(key) || { ...c, outcome: "pending" };
      if (c.result === "sent") row.t = c.t; else row.outcome = String(c.result || "?");
      byId.set(key, row);
    }
    const rows = [...byId.values()].sort((a, b) => (b.t || 0) - (a.t || 0)).slice(0, 40).map((c) => {
      const kind = c.outcome.split(" ")[0];
      return el("tr", { "data-testid": "control-row", "data-site": c.site || "", "data-outcome": kind },
        el("td", {}, isNum(c.t) ? new Date(c.t * 1000).toLocaleTimeString() : "-"), el("td", {}, c.site || "-"),
        el("td", {}, c.meid || "-"), el("td", {}, fmt(c.control_id)), el("td", {}, c.kind || "-"),
        el("td", {}, controlDetail(c)), el("td", { class: kind }, c.outcome));
    });
    $("controls").tBodies[0].replaceChildren(...(rows.length ? rows : [el("tr", { class: "empty" }, el("td", { colSpan: 7 }, "no control sent yet"))]));
    return [...byId.values()];
  }

  function renderSummary(controls) {
    const tracks = [...S.sites.values()];
    const sum = (f) => tracks.reduce((a, t) => a + (isNum(f(t)) ? f(t) : 0), 0);
    const live = tracks.filter((t) => t.status === "live").length;
    const lost = tracks.filter((t) => t.status === "lost").length;
    const acked = controls.filter((c) => c.outcome === "ack").length;
    const used = sum((t) => (t.status === "lost" || !t.used.length ? 0 : t.used[t.used.length - 1].v));
    const text = [`epoch ${S.epoch ?? "-"}`, `sites ${live}/${tracks.length} live${lost ? `, ${lost} lost` : ""}`,
      `demand ${fmt(sum((t) => t.view.demand_mean_sms), 1)} SMs`, `granted ${fmt(sum((t) => t.view.grant_sms))} SMs`,
      `used ${fmt(used, 1)} SMs`, `misses ${fmt(sum((t) => t.view.misses_reported))}`,
      `controls ${acked}/${controls.length} acked`].join(" | ");
    $("summary").textContent = text;
  }

  function setConnection(ok, detail) {
    const c = $("conn");
    c.dataset.state = ok ? "ok" : "down";
    c.textContent = ok ? `live, updated ${new Date().toLocaleTimeString()}` : `xApp unreachable, retrying (${detail})`;
    c.title = detail || "";
  }

  // ---------------------------------------------------------------- the poll loop
  async function refreshConfig() {
    try {
      const doc = await getJson("/api/v1/config");
      const c = (doc && doc.controls) || {};
      if (isNum(c.period_ms) && c.period_ms > 0) S.periodS = c.period_ms / 1000;
      if (isNum(c.stale_periods)) S.staleS = c.stale_periods * S.periodS;
      if (c.rest && isNum(c.rest.history_minutes)) S.historyMin = c.rest.history_minutes;
      const b = c.broker || {};
      if (isNum(b.heartbeat_ms)) S.heartbeatS = (b.heartbeat_ms / 1000) * (isNum(b.agent_timeout_heartbeats) ? b.agent_timeout_heartbeats : 3);
      S.configAt = Date.now();
    } catch (e) { /* keep the defaults; retried next poll */ }
  }

  async function fetchSeries(track) {
    const last = track.lastT();
    const minutes = last === null ? S.historyMin : Math.min(S.historyMin, Math.max(0.1, (nowS() - last) / 60 + 0.05));
    const doc = await getJson(`/api/v1/sites/${encodeURIComponent(track.id)}/series?minutes=${minutes.toFixed(3)}`);
    track.merge(doc && Array.isArray(doc.points) ? doc.points : []);
  }

  async function poll() {
    if (Date.now() - S.configAt > 30000) await refreshConfig();
    let sites;
    try {
      const doc = await getJson("/api/v1/sites");
      sites = doc && Array.isArray(doc.sites) ? doc.sites : [];
    } catch (e) {
      S.failures += 1;
      setConnection(false, String(e && e.message ? e.message : e));
      for (const t of S.sites.values()) if (t.card) drawChart(t);   // time moves on; keep the data
      return;
    }
    S.failures = 0;
    const seen = new Set();
    for (const v of sites) {
      if (!v || typeof v.site_id !== "string") continue;
      seen.add(v.site_id);
      if (!S.sites.has(v.site_id)) S.sites.set(v.site_id, new SiteTrack(v.site_id));
      S.sites.get(v.site_id).update(v);
    }
    for (const t of S.sites.values()) if (!seen.has(t.id)) t.reported = false;
    const summary = summaryMode();                 // once a poll: it scans every site
    const charted = (t) => !summary || S.drill.has(t.id);
    const [agents, controls, transfers, subs, wf] = await Promise.allSettled([
      getJson("/api/v1/agents"), getJson("/api/v1/controls"), getJson("/api/v1/transfers"),
      getJson("/api/v1/subscriptions"), getJson("/api/v1/waterfall"),
      ...[...S.sites.values()].filter((t) => t.reported && charted(t)).map((t) => fetchSeries(t).catch(() => null)),
    ]);
    if (agents.status === "fulfilled" && agents.value) {
      if (agents.value.epoch !== undefined) S.epoch = agents.value.epoch;
      renderAgents(Array.isArray(agents.value.agents) ? agents.value.agents : []);
    }
    if (wf.status === "fulfilled" && wf.value && wf.value.sites && typeof wf.value.sites === "object") {
      for (const t of S.sites.values()) if (wf.value.sites[t.id]) t.waterfall = wf.value.sites[t.id];
    }
    classifyAll();
    for (const t of S.sites.values()) {
      if (charted(t)) renderCard(t);
      else dropCard(t);                 // summary mode: a chart only for an opened site
    }
    renderSiteTable();
    let ctl = [];
    if (controls.status === "fulfilled" && controls.value) ctl = renderControls(Array.isArray(controls.value.controls) ? controls.value.controls : []);
    if (transfers.status === "fulfilled" && transfers.value) renderTransfers(Array.isArray(transfers.value.transfers) ? transfers.value.transfers : []);
    if (subs.status === "fulfilled" && subs.value) renderSubscriptions(subs.value);
    renderSummary(ctl);
    setConnection(true);
    document.body.dataset.polls = String(Number(document.body.dataset.polls || 0) + 1);
  }

  async function loop() {
    try {
      await poll();
    } catch (e) {
      // A bug in rendering must not stop the refresh: show it and go on.
      setConnection(false, `dashboard error: ${e && e.message ? e.message : e}`);
      console.error(e);
    }
    setTimeout(loop, POLL_MS);
  }

  $("site-filter").addEventListener("input", renderSiteTable);
  $("window").addEventListener("change", () => { for (const t of S.sites.values()) if (t.card) drawChart(t); });
  window.addEventListener("resize", () => { for (const t of S.sites.values()) if (t.card) drawChart(t); });
  loop();
})();
