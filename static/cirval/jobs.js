// Polls a background job's JSON status (imports, audits, exports: one shape) and keeps the
// progress card current until the job ends; reloads the page when it is done if asked
// (data-reload-on-done), e.g. to show an audit's report or an export's files.
(function () {
  "use strict";
  const box = document.getElementById("job");
  if (!box) return;
  const url = box.dataset.statusUrl;
  const $ = (id) => document.getElementById(id);
  function eta(seconds) {
    if (seconds === null || seconds === undefined) return "—";
    const s = Math.round(seconds), h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60);
    return (h ? h + " h " : "") + (h || m ? m + " min " : "") + (s % 60) + " s";
  }
  function show(s) {
    $("job-status").textContent = s.status;
    $("job-status").className = "status " + s.status;
    $("job-stage").textContent = s.stage && s.stage !== s.status ? s.stage : "";
    $("job-progress").value = s.percent;
    $("job-count").textContent = s.done + " / " + s.total;
    if ($("job-eta")) $("job-eta").textContent = eta(s.eta_seconds);
    const idle = $("job-noworker");  // jobs wait and no worker beats
    if (idle) { idle.hidden = !s.no_worker; idle.textContent = s.no_worker || ""; }
    if (s.error) { $("job-error").hidden = false; $("job-error").textContent = s.error; }
    const report = $("job-report");
    if (report && s.report && Object.keys(s.report).length) { report.hidden = false; report.textContent = JSON.stringify(s.report, null, 2); }
    const wait = $("job-wait"); if (wait && s.status !== "queued") wait.hidden = true;
  }
  async function poll() {
    try {
      const r = await fetch(url, { headers: { Accept: "application/json" }, credentials: "same-origin" });
      if (r.ok) {
        const s = await r.json();
        show(s);
        // reload once, for a page rendered before the job ended (then it renders "done")
        if (s.status === "done" && "reloadOnDone" in box.dataset && box.dataset.status !== "done") {
          window.location.reload(); return;
        }
        if (s.status === "done" || s.status === "failed") return;
      }
    } catch (e) { /* network hiccup: try again */ }
    setTimeout(poll, 1000);
  }
  poll();
})();
