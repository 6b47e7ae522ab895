// The item page's guidelines drawer (opened with ? by the page script): links in the
// guidelines open in a new tab, and clicks inside the text do not close the drawer.
// The drawer is read from the keyboard too: at 1366x768 the guidelines and the key list are
// taller than the screen, so its card is a focusable region (axe-core's
// scrollable-region-focusable) that takes the focus when the drawer opens and gives it back
// when it closes; while it is open the page's shortcuts do not act behind it (as in the zoom
// view), so the arrow, page and space keys scroll the drawer. ? and Esc still close it.
(function () {
  "use strict";
  const text = document.getElementById("guidelines");
  if (text) {
    text.querySelectorAll("a[href]").forEach((a) => { a.target = "_blank"; a.rel = "noopener"; });
    text.addEventListener("click", (e) => { if (!e.target.closest("a")) e.stopPropagation(); });
  }
  const drawer = document.getElementById("help");
  const card = drawer && drawer.querySelector(".card");
  if (!card || !window.MutationObserver) return;
  card.tabIndex = 0;
  card.setAttribute("role", "region");
  card.setAttribute("aria-label", "Guidelines and keyboard shortcuts");
  let opener = null;
  new MutationObserver(() => {
    if (!drawer.hidden) {
      opener = document.activeElement;
      card.focus({ preventScroll: true });
    } else if (drawer.contains(document.activeElement) || document.activeElement === document.body) {
      if (opener && opener !== document.body && document.contains(opener)) opener.focus({ preventScroll: true });
      opener = null;
    }
  }).observe(drawer, { attributes: true, attributeFilter: ["hidden"] });
  // Capture phase on the document, registered after the page script's activity listener (a key
  // read in the drawer still keeps the lease) and before its shortcuts (the bubble phase).
  document.addEventListener("keydown", (ev) => {
    if (drawer.hidden || ev.key === "?" || ev.key === "Escape") return;
    ev.stopImmediatePropagation();
  }, true);
})();
