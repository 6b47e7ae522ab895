// Layout helpers of the item page: the judgement form never submits itself (its buttons
// are handled by the page script), and the question being answered (the active scale, the
// chosen category or sub-reason) is scrolled into view inside the rubric's scrolling part.
(function () {
  "use strict";
  const form = document.getElementById("judgement-form");
  if (!form) return;
  form.addEventListener("submit", (e) => e.preventDefault());
  const body = form.querySelector(".rubric-body");
  if (!body || !window.MutationObserver) return;
  const watched = ".scale.active, label.choice.on, .turnchecks.active, .subs:not([hidden])";
  new MutationObserver((changes) => {
    for (const c of changes) {
      const el = c.target;
      if (el.nodeType === 1 && el.matches(watched)) { el.scrollIntoView({ block: "nearest" }); }
    }
  }).observe(body, { subtree: true, attributes: true, attributeFilter: ["class", "hidden"] });
})();
