// The item page's guidelines drawer (opened with ? by the page script): links in the
// guidelines open in a new tab, and clicks inside the text do not close the drawer.
(function () {
  "use strict";
  const text = document.getElementById("guidelines");
  if (!text) return;
  text.querySelectorAll("a[href]").forEach((a) => { a.target = "_blank"; a.rel = "noopener"; });
  text.addEventListener("click", (e) => { if (!e.target.closest("a")) e.stopPropagation(); });
})();
