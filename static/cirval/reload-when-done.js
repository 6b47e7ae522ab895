// Job pages (imports, exports): when the job ends, reload once so the server shows its
// readable result (counts, warnings, files) instead of the live progress.
(function () {
  "use strict";
  const status = document.getElementById("job-status");
  if (!document.getElementById("job") || !status) return;
  const start = status.textContent;
  if (start === "done" || start === "failed") return;
  const timer = setInterval(function () {
    const s = document.getElementById("job-status").textContent;
    if (s === "done" || s === "failed") { clearInterval(timer); window.location.reload(); }
  }, 1000);
})();
