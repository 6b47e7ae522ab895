// Polls an audit's JSON status: progress, ETA; reloads the page for the report when done.
(function () {
  "use strict";
  const box = document.getElementById("audit-job");
  if (!box) return;
  const url = box.dataset.statusUrl;
  const $ = (id) => document.getElementById(id);
  function eta(seconds) {
    if (seconds === null || seconds === undefined) return "—";
    const s = Math.round(seconds), h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60);
    return (h ? h + " h " : "") + (h || m ? m + " min " : "") + (s % 60) + " s";
  }
  function show(s) {
    $("audit-status").textContent = s.status;
    $("audit-status").className = "status " + s.status;
    $("audit-stage").textContent = s.stage || "";
    $("audit-progress").value = s.percent;
    $("audit-count").textContent = s.done + " / " + s.total;
    $("audit-eta").textContent = eta(s.eta_seconds);
    if (s.error) { $("audit-error").hidden = false; $("audit-error").textContent = s.error; }
    const wait = $("audit-wait"); if (wait && s.status !== "queued") wait.hidden = true;
  }
  async function poll() {
    try {
      const r = await fetch(url, { headers: { Accept: "application/json" }, credentials: "same-origin" });
      if (r.ok) {
        const s = await r.json();
        show(s);
        if (s.status === "done") { window.location.reload(); return; }
        if (s.status === "failed") return;
      }
    } catch (e) { /* network hiccup: try again */ }
    setTimeout(poll, 1500);
  }
  poll();
})();
