// Polls a background job's JSON status and updates the progress bar until it ends.
(function () {
  "use strict";
  const box = document.getElementById("job");
  if (!box) return;
  const url = box.dataset.statusUrl;
  const $ = (id) => document.getElementById(id);
  function show(s) {
    $("job-status").textContent = s.status;
    $("job-status").className = "status " + s.status;
    $("job-stage").textContent = s.stage || "";
    $("job-progress").value = s.percent;
    $("job-count").textContent = s.done + " / " + s.total;
    if (s.error) { $("job-error").hidden = false; $("job-error").textContent = s.error; }
    if (s.report && Object.keys(s.report).length) { $("job-report").hidden = false; $("job-report").textContent = JSON.stringify(s.report, null, 2); }
    const wait = $("job-wait"); if (wait && s.status !== "queued") wait.hidden = true;
  }
  async function poll() {
    try {
      const r = await fetch(url, { headers: { Accept: "application/json" }, credentials: "same-origin" });
      if (r.ok) {
        const s = await r.json();
        show(s);
        if (s.status === "done" || s.status === "failed") return;
      }
    } catch (e) { /* network hiccup: try again */ }
    setTimeout(poll, 1000);
  }
  poll();
})();
