// The item page's guidelines drawer (opened with ? by the page script): links in the
// guidelines open in a new tab, clicks inside the text do not close the drawer, and the
// judgement form never submits itself (its buttons are handled by the page script).
(function () {
  "use strict";
  const form = document.getElementById("judgement-form");
  if (form) form.addEventListener("submit", (e) => e.preventDefault());
  const text = document.getElementById("guidelines");
  if (!text) return;
  text.querySelectorAll("a[href]").forEach((a) => { a.target = "_blank"; a.rel = "noopener"; });
  text.addEventListener("click", (e) => { if (!e.target.closest("a")) e.stopPropagation(); });
})();
