// "Check again" forms (data-check-after="<seconds>") post themselves once that many seconds
// have passed, counting down in the element named by data-countdown: an annotator told to wait
// for a refit of the study's annotator model is served again without having to come back.
(function () {
  "use strict";
  document.querySelectorAll("form[data-check-after]").forEach(function (form) {
    let left = parseInt(form.dataset.checkAfter, 10) || 30;
    const shown = form.dataset.countdown ? document.getElementById(form.dataset.countdown) : null;
    const tick = setInterval(function () {
      left -= 1;
      if (shown) shown.textContent = String(Math.max(left, 0));
      if (left <= 0) {
        clearInterval(tick);
        form.submit();
      }
    }, 1000);
  });
})();
