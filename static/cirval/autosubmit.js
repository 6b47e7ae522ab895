// <select data-autosubmit>: choosing an option submits its form (no inline handler).
(function () {
  "use strict";
  document.querySelectorAll("select[data-autosubmit]").forEach((el) => {
    el.addEventListener("change", () => el.form && el.form.submit());
  });
})();
