// Pages that only lead to a state change (reserving the next item) post their form on load:
// the GET that brought the browser here changed nothing.
(function () {
  "use strict";
  const form = document.getElementById("next-item-form");
  if (form) form.submit();
})();
