// Pages that refresh themselves: every element with data-live and an id is replaced by
// its fresh copy from the same URL every few seconds (data-live-seconds on <body> or 5),
// while the tab is visible. No full reload: forms being filled in elsewhere stay as they are.
(function () {
  "use strict";
  const live = () => [...document.querySelectorAll("[data-live][id]")];
  if (!live().length) return;
  const seconds = Number(document.body.dataset.liveSeconds || 5);
  let busy = false;
  async function tick() {
    if (busy || document.visibilityState !== "visible") return;
    busy = true;
    try {
      const r = await fetch(location.href, { credentials: "same-origin", headers: { "X-Live-Refresh": "1" } });
      if (r.ok) {
        const doc = new DOMParser().parseFromString(await r.text(), "text/html");
        for (const el of live()) {
          const fresh = doc.getElementById(el.id);
          if (fresh && fresh.innerHTML !== el.innerHTML) el.replaceWith(document.importNode(fresh, true));
        }
        document.body.dataset.refreshedAt = new Date().toISOString();
      }
    } catch (e) { /* offline: try again next time */ }
    busy = false;
  }
  setInterval(tick, seconds * 1000);
})();
