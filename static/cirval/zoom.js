// The zoom view of the annotator page: reference and target side by side, at full
// resolution and the same scale, with panning. The full images are fetched only when the
// view opens; thumbnails stay as they are. Also writes each image's pixel size under it.
(function () {
  "use strict";
  const payloadEl = document.getElementById("item-payload");
  const rubricEl = document.getElementById("rubric-def");
  if (!payloadEl || !rubricEl) return;
  const payload = JSON.parse(payloadEl.textContent);
  const rubric = JSON.parse(rubricEl.textContent);
  const turns = payload.query.turns;
  const targets = payload.query.targets.filter(Boolean);
  // In the session rubric "z" is a reject flag: there the zoom key is Shift+Z.
  const keys = [];
  (function walk(x) {
    if (Array.isArray(x)) x.forEach(walk);
    else if (x && typeof x === "object") for (const [k, v] of Object.entries(x)) { if (k === "shortcut_key") keys.push(String(v).toLowerCase()); else walk(v); }
  })(rubric);
  const zoomKey = keys.includes("z") ? "Z" : "z";
  // A candidate opens at full size beside the labelled target: "v" (Shift+V where the rubric uses "v").
  const candKey = keys.includes("v") ? "V" : "v";
  const panel = payload.panel || [];

  function px(ref) { return ref && ref.width && ref.height ? ref.width + "×" + ref.height + " px" : "size unknown"; }

  // ---- pixel sizes under the thumbnails ---------------------------------------------
  function label(img, ref) {
    if (!img || !ref) return;
    const s = document.createElement("span");
    s.className = "pxsize";
    s.textContent = px(ref);
    img.insertAdjacentElement("afterend", s);
  }
  label(document.getElementById("reference-img"), turns[0] && turns[0].reference);
  document.querySelectorAll(".targets figure.target img").forEach((img, i) => label(img, targets[i]));
  document.querySelectorAll(".filmstrip .frame:not(.goal) img").forEach((img) => {
    const t = Number(img.closest(".frame").dataset.turn);
    label(img, turns[t] && turns[t].reference);
  });
  document.querySelectorAll(".filmstrip .frame.goal img").forEach((img, i) => label(img, targets[i]));

  // ---- the overlay ----------------------------------------------------------------------
  const view = document.createElement("div");
  view.id = "zoom";
  view.className = "zoomview";
  view.hidden = true;
  view.setAttribute("role", "dialog");
  view.setAttribute("aria-label", "Zoom view");
  view.innerHTML =
    '<div class="zoombar"><b>Zoom</b> <span id="zoom-scale"></span>' +
    '<button type="button" data-z="out">− <kbd>-</kbd></button><button type="button" data-z="fit">Fit <kbd>0</kbd></button>' +
    '<button type="button" data-z="one">100 % <kbd>1</kbd></button><button type="button" data-z="in">+ <kbd>+</kbd></button>' +
    '<span class="muted small">drag or scroll to pan · same scale on both sides</span>' +
    '<button type="button" data-z="close" class="zoomclose">Close <kbd>Esc</kbd></button></div>' +
    '<div class="zoompanes"></div>';
  document.body.appendChild(view);
  const panes = view.querySelector(".zoompanes");
  const scaleText = view.querySelector("#zoom-scale");
  let scale = 1;
  let shown = [];

  function pane(title, ref) {
    const box = document.createElement("div");
    box.className = "zoompane";
    const head = document.createElement("div");
    head.className = "zoomhead";
    head.textContent = title + " · " + px(ref);
    const port = document.createElement("div");
    port.className = "zoomport";
    const img = document.createElement("img");
    img.alt = title + " at full resolution";
    img.draggable = false;
    img.src = ref.url; // the full image: fetched now, not before
    port.appendChild(img);
    box.append(head, port);
    panes.appendChild(box);
    drag(port);
    return { ref, img, port, head, title };
  }
  function natural(s) { return { w: s.img.naturalWidth || s.ref.width || 1, h: s.img.naturalHeight || s.ref.height || 1 }; }
  function fitScale() {
    // one factor for both sides: the largest that fits every image in its pane
    let f = Infinity;
    for (const s of shown) {
      const n = natural(s);
      f = Math.min(f, s.port.clientWidth / n.w, s.port.clientHeight / n.h);
    }
    return isFinite(f) && f > 0 ? f : 1;
  }
  function apply() {
    for (const s of shown) {
      const n = natural(s);
      s.img.style.width = Math.round(n.w * scale) + "px";
      s.img.style.height = Math.round(n.h * scale) + "px";
      s.img.classList.toggle("pixelated", scale >= 2);
      s.head.textContent = s.title + " · " + n.w + "×" + n.h + " px";
    }
    scaleText.textContent = Math.round(scale * 100) + " %";
    view.dataset.scale = String(scale);
  }
  function setScale(x) { scale = Math.max(0.05, Math.min(16, x)); apply(); }

  function drag(port) {
    let start = null;
    port.addEventListener("pointerdown", (e) => {
      start = { x: e.clientX, y: e.clientY, l: port.scrollLeft, t: port.scrollTop };
      port.setPointerCapture(e.pointerId);
      port.classList.add("grabbing");
    });
    port.addEventListener("pointermove", (e) => {
      if (!start) return;
      port.scrollLeft = start.l - (e.clientX - start.x);
      port.scrollTop = start.t - (e.clientY - start.y);
    });
    const stop = () => { start = null; port.classList.remove("grabbing"); };
    port.addEventListener("pointerup", stop);
    port.addEventListener("pointercancel", stop);
  }

  // where the keyboard focus goes back to on close: the candidate opened (its ⤢ button, which
  // a mouse click leaves focused, is no stop of its own), so Space then ticks it again
  let returnTo = null;
  function open(turnIndex, targetIndex, candidate) {
    const t = turns[turnIndex] || turns[0];
    returnTo = candidate != null ? document.querySelector('#candgrid .cand[data-index="' + candidate + '"] .candpick') : null;
    const sides = [];
    const tg = targets[targetIndex] || targets[0];
    if (candidate != null && panel[candidate]) {
      // a candidate: the labelled target beside it, to compare (the reference when there is no target)
      if (tg) sides.push(["Target", tg]);
      else if (t && t.reference) sides.push(["Reference", t.reference]);
      sides.push(["Candidate " + (candidate + 1), panel[candidate]]);
    } else {
      if (t && t.reference) sides.push(["Reference" + (turns.length > 1 ? " (turn " + t.index + ")" : ""), t.reference]);
      if (tg) sides.push(["Target", tg]);
    }
    if (!sides.length) return;
    panes.textContent = "";
    shown = sides.map(([title, ref]) => pane(title, ref));
    view.hidden = false;
    document.body.classList.add("zooming");
    let waiting = shown.length;
    const ready = () => { waiting -= 1; if (waiting <= 0) setScale(fitScale()); };
    shown.forEach((s) => { if (s.img.complete && s.img.naturalWidth) ready(); else { s.img.onload = ready; s.img.onerror = ready; } });
    apply();
  }
  function close() {
    view.hidden = true;
    document.body.classList.remove("zooming");
    panes.textContent = ""; // drops the full images
    shown = [];
    if (returnTo) { returnTo.focus({ preventScroll: true }); returnTo = null; }
  }

  view.addEventListener("click", (e) => {
    const b = e.target.closest("button[data-z]");
    if (!b) return;
    const z = b.dataset.z;
    if (z === "close") close();
    else if (z === "in") setScale(scale * 1.5);
    else if (z === "out") setScale(scale / 1.5);
    else if (z === "one") setScale(1);
    else if (z === "fit") setScale(fitScale());
  });

  // ---- opening: click an image, or the zoom key -------------------------------------------
  const ref0 = document.getElementById("reference-img");
  if (ref0) ref0.addEventListener("click", () => open(0, 0));
  document.querySelectorAll(".targets figure.target img").forEach((img, i) => img.addEventListener("click", () => open(0, i)));
  document.querySelectorAll(".filmstrip .frame img").forEach((img) => {
    img.addEventListener("click", () => {
      const frame = img.closest(".frame");
      open(frame.classList.contains("goal") ? turns.length - 1 : Number(frame.dataset.turn), 0);
    });
  });
  document.querySelectorAll("#candgrid .cand .cand-zoom").forEach((b) => {
    b.addEventListener("click", (ev) => { ev.stopPropagation(); open(0, 0, Number(b.closest(".cand").dataset.index)); });
  });
  document.querySelectorAll("#reference-img, .targets img, .filmstrip .frame img").forEach((img) => {
    img.classList.add("zoomable");
    img.title = "Click to zoom (key " + (zoomKey === "Z" ? "Shift+Z" : "z") + ")";
  });

  function activeTurn() {
    const a = document.querySelector(".filmstrip .frame.active");
    return a ? Number(a.dataset.turn) : 0;
  }
  // Capture phase on window: runs before the page's own shortcuts, which must not fire
  // while the zoom view is open.
  window.addEventListener("keydown", (ev) => {
    const typing = ev.target && (ev.target.tagName === "TEXTAREA" || ev.target.tagName === "INPUT" && ev.target.type === "text");
    if (view.hidden) {
      if (!typing && !ev.ctrlKey && !ev.altKey && !ev.metaKey && ev.key === zoomKey) {
        ev.preventDefault();
        ev.stopImmediatePropagation();
        open(activeTurn(), 0);
      }
      const current = document.querySelector("#candgrid .cand.cursor:not([hidden])");
      if (!typing && !ev.ctrlKey && !ev.altKey && !ev.metaKey && ev.key === candKey && current) {
        ev.preventDefault();
        ev.stopImmediatePropagation();
        open(0, 0, Number(current.dataset.index));
      }
      return;
    }
    ev.stopImmediatePropagation();
    const k = ev.key;
    if (k === "Escape" || k === zoomKey || k === candKey) close();
    else if (k === "+" || k === "=") setScale(scale * 1.5);
    else if (k === "-") setScale(scale / 1.5);
    else if (k === "1") setScale(1);
    else if (k === "0") setScale(fitScale());
    else return;
    ev.preventDefault();
  }, true);
})();
