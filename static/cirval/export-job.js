// The export job page: when the job ends, reload once so its file list appears.
(function () {
  "use strict";
  const box = document.getElementById("job");
  const status = document.getElementById("job-status");
  if (!box || !status || status.textContent === "done") return;
  const timer = setInterval(function () {
    const s = document.getElementById("job-status").textContent;
    if (s === "done") { clearInterval(timer); window.location.reload(); }
    if (s === "failed") clearInterval(timer);
  }, 1000);
})();
