"""The web view's one stylesheet and one script, served from this server (the CSP allows
nothing else): no CDN, no font, no image fetched from anywhere."""

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;color:#1d2330;background:#fff}
header.top{display:flex;gap:18px;align-items:center;padding:10px 20px;background:#1d2330;color:#fff}
header.top a{color:#fff;text-decoration:none}header.top a.here{text-decoration:underline}
header.top .who{margin-left:auto;color:#c9d1e0;font-size:12.5px}
main{padding:14px 20px}h1{font-size:19px;margin:4px 0 10px}h2{font-size:15px;margin:16px 0 6px}
table{border-collapse:collapse;width:100%;font-size:12.5px}td,th{border-bottom:1px solid #e3e7ef;padding:3px 6px;text-align:left;vertical-align:top}
th a{color:inherit}td.goal{max-width:28em;overflow-wrap:anywhere}
.counts{display:flex;flex-wrap:wrap;gap:8px;margin:0 0 10px;padding:0;list-style:none}
.counts li{border:1px solid #d8dde8;border-radius:4px;padding:3px 8px;font-size:12.5px}.counts a{color:inherit}
form.filters{display:flex;flex-wrap:wrap;gap:8px;align-items:end;margin:0 0 10px}
form.filters label{display:flex;flex-direction:column;font-size:12px;color:#555}
input,select,button,textarea{font:inherit;font-size:13px}
.h-healthy{color:#2f7d4f}.h-stalled,.h-silent-worker{color:#b36b00}.h-unavailable,.h-needs_reconciliation,.h-delivery_ambiguous{color:#c0392b;font-weight:600}
.h-blocked,.h-awaiting_owner{color:#7a4fb3}.note{color:#6a7385;font-size:12.5px}
.pager{margin:10px 0}.pager a{margin-right:12px}
dl.facts{display:grid;grid-template-columns:200px 1fr;gap:3px 14px;margin:0}dl.facts dt{font-weight:600}dl.facts dd{margin:0;overflow-wrap:anywhere}
.actions{display:flex;flex-wrap:wrap;gap:10px;margin:8px 0}.actions form{border:1px solid #d8dde8;border-radius:4px;padding:8px;display:flex;flex-direction:column;gap:4px;min-width:220px}
.actions legend{font-weight:600}.flash{padding:8px 10px;border-radius:4px;margin:8px 0}.flash.ok{background:#e3f4ea}.flash.refused{background:#fbe3e1}
#events tr:target{background:#ffe3f2}#events tr.new{background:#fff6d6}#events td.type{font-family:ui-monospace,monospace}
iframe.report{width:100%;height:900px;border:1px solid #d8dde8;margin-top:10px}
.live{font-size:12px;color:#6a7385}.live.on{color:#2f7d4f}
"""

#: The run page's script: follow the run's events (EventSource to this server), add each
#: as a row (text only: textContent, never markup), reload the embedded report when the
#: story moved on, and on an address ending in #seq-N select that event in the report; when
#: the server drops the page for falling behind, say so and stop.
JS = r"""
"use strict";
const main = document.querySelector("main[data-run]");
if (main) {
  const tbody = document.querySelector("#events tbody");
  const live = document.getElementById("live");
  const frame = document.querySelector("iframe.report");
  let last = Number(main.dataset.lastSeq || 0), reloadTimer = null;
  function selectInReport() {
    const m = /^#seq-(\d+)$/.exec(location.hash);
    if (!m || !frame || !frame.contentDocument) return;
    const el = frame.contentDocument.querySelector('#ev-' + m[1]) || frame.contentDocument.querySelector('[data-seq="' + m[1] + '"]');
    if (el) el.dispatchEvent(new MouseEvent("click", {bubbles: true}));
  }
  if (frame) frame.addEventListener("load", selectInReport);
  window.addEventListener("hashchange", selectInReport);
  function addRow(e) {
    if (e.seq <= last) return;
    last = e.seq; main.dataset.lastSeq = String(e.seq);
    const tr = document.createElement("tr"); tr.id = "seq-" + e.seq; tr.className = "new";
    const a = document.createElement("a"); a.href = "#seq-" + e.seq; a.textContent = String(e.seq);
    const td0 = tr.insertCell(); td0.appendChild(a);
    for (const [k, cls] of [["at", ""], ["actor", ""], ["type", "type"], ["summary", ""]]) { const td = tr.insertCell(); td.textContent = e[k] === null ? "-" : String(e[k]); if (cls) td.className = cls; }
    tbody.insertBefore(tr, tbody.firstChild);
  }
  const src = new EventSource(main.dataset.feed + "?after=" + last);
  src.addEventListener("open", () => { live.textContent = "live"; live.className = "live on"; });
  src.addEventListener("error", () => { live.textContent = "reconnecting"; live.className = "live"; });
  src.addEventListener("events", ev => {
    for (const e of JSON.parse(ev.data)) addRow(e);
    if (frame) { clearTimeout(reloadTimer); reloadTimer = setTimeout(() => frame.contentWindow.location.reload(), 800); }
  });
  // The server stopped following for this page (it fell too far behind): say so, stop.
  src.addEventListener("dropped", ev => {
    src.close(); live.textContent = "stopped"; live.className = "live";
    const p = document.createElement("p"); p.id = "dropped"; p.className = "flash refused";
    p.textContent = JSON.parse(ev.data); main.insertBefore(p, main.children[1] || null);
  });
  src.addEventListener("status", ev => {
    const s = JSON.parse(ev.data);
    for (const [k, v] of Object.entries(s)) { const el = document.querySelector('[data-fact="' + k + '"]'); if (el) el.textContent = v; }
    const h = document.querySelector('[data-fact="health"]'); if (h) h.className = "h-" + s.health;
  });
}
document.body.dataset.ready = "1";
"""
