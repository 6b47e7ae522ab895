// The annotator page: keyboard-first judging with autosaved drafts.
// Works for category rubrics (validity) and session rubrics (scales, per-turn checks, reject flags).
(function () {
  "use strict";
  const payload = JSON.parse(document.getElementById("item-payload").textContent);
  const rubric = JSON.parse(document.getElementById("rubric-def").textContent);
  const urls = JSON.parse(document.getElementById("urls").textContent);
  const leaseCfg = JSON.parse(document.getElementById("lease-config").textContent);
  const csrf = document.querySelector("meta[name=csrf-token]").content;
  const form = document.getElementById("judgement-form");
  const errorBox = document.getElementById("form-error");
  const note = document.getElementById("note");
  const flagged = document.getElementById("flagged");
  const isSession = rubric.kind === "session";
  const nTurns = payload.query.n_turns;
  // Session rubric v2: a valid / invalid verdict on every turn, given in the filmstrip. The
  // radios live in the frames (outside the form element, tied to it by form="judgement-form").
  const turnVerdict = isSession ? rubric.turn_verdict || null : null;
  function verdictInput(t, value) { return document.querySelector(`input[name="turnv-${t}"][value="${value ? 1 : 0}"]`); }
  function turnVerdictOf(t) {
    const el = document.querySelector(`input[name="turnv-${t}"]:checked`);
    return el ? el.value === "1" : null;
  }

  // ---- state -------------------------------------------------------------------
  // Drafts live in two places: localStorage (written synchronously on every change, a
  // tick or "None fit" included, so a reload a few ms after it finds it) and the server
  // (debounced, for another browser). The local copy stays until the server acknowledges
  // an edit at least as new (by edited_at); the newer one wins on load; a draft older
  // than the stored judgement is stale.
  const localKey = "cirval-draft-" + payload.assignment;
  // Back/Forward may restore this page from the browser's memory as it was before a submit:
  // fetch it again, so that it shows the item's stored answer (the page is also no-store).
  window.addEventListener("pageshow", (e) => { if (e.persisted) location.reload(); });
  function localDraft() {
    try { return JSON.parse(localStorage.getItem(localKey) || "null"); } catch (e) { return null; }
  }
  function newestDraft() {
    const judgedAt = payload.judgement ? Date.parse(payload.judgement.created_at) : 0;
    // A server draft saved before drafts carried edited_at counts as the oldest possible.
    const stamp = (d) => d.edited_at || 1;
    const found = [payload.draft, localDraft()].filter((d) => d && stamp(d) > judgedAt);
    found.sort((x, y) => stamp(y) - stamp(x));
    return found[0] || null;
  }
  const restoredDraft = newestDraft();
  const start = restoredDraft || payload.judgement || {};
  let elapsed = Number(start.elapsed_ms || 0);
  let shownAt = document.visibilityState === "visible" ? Date.now() : null;
  // A client token belongs to this page load only: a second tab, or a reload, never
  // resubmits under another page's token.
  let token = newToken();
  // The revision this page shows: a submit over a newer one is answered 409.
  let baseRevision = payload.judgement ? payload.judgement.revision : 0;
  let busy = false;
  let dirty = false;
  let afterLate = false;
  let activeScale = isSession && rubric.scales.length ? rubric.scales[0].key : null;
  let activeTurn = 0;

  // ---- candidate panel: tick the images that fit as well as the target ----------
  // Pages of pageSize candidates, likely fits first. The first `ahead` pages are open, and a
  // page with a tick opens the `ahead` pages after it, up to the panel's depth: pages open
  // until `ahead` pages in a row bring no tick (annotation.alternatives.paging.pages_shown,
  // the same rule on the server); the annotator may also open the next page at will ("›",
  // PageDown) up to that depth, "None fit" included: it answers for the pages shown, never
  // for the rest. Every shown page fits on screen; no candidate is on a page the annotator
  // cannot reach.
  const cands = Array.from(document.querySelectorAll("#candgrid .cand"));
  const pageSize = payload.panel_page_size || 10;
  const ahead = payload.panel_pages_ahead || 2;
  const nPages = Math.max(1, Math.ceil(cands.length / pageSize));
  const ticks = new Set((start.alternatives || []).map(Number));
  let noneFit = !!start.none_fit;
  let cursor = 0;
  // pages opened at will (the ticks open more by themselves); a draft keeps them over a reload
  let opened = Math.min(nPages, Math.max(1, Math.floor(Number(start.pages_opened)) || 1));
  function pagesShown() {
    let last = -1;
    cands.forEach((c, i) => { if (ticks.has(Number(c.dataset.id))) last = Math.floor(i / pageSize); });
    return Math.min(nPages, Math.max(opened, last + 1 + ahead));
  }
  // the next page ("›": its first candidate; PageDown: the same place on it), opened at will if need be
  function nextPage(sameColumn) {
    const page = Math.floor(cursor / pageSize);
    if (page >= nPages - 1) return;
    const more = page + 2 > opened;
    opened = Math.max(opened, page + 2);
    moveCursor(sameColumn ? cursor + pageSize : (page + 1) * pageSize);
    if (more) edited(); // the draft keeps the page open
  }
  function panelColumns() {
    const shown = cands.filter((c) => !c.hidden);
    if (shown.length < 2) return 1;
    const top = shown[0].offsetTop;
    const n = shown.findIndex((c) => c.offsetTop !== top);
    return n < 0 ? shown.length : n;
  }
  function renderPanel() {
    if (!cands.length) return;
    const open = pagesShown();
    cursor = Math.min(cursor, Math.min(cands.length, open * pageSize) - 1);
    const page = Math.floor(cursor / pageSize);
    cands.forEach((c, i) => {
      const on = ticks.has(Number(c.dataset.id));
      c.hidden = Math.floor(i / pageSize) !== page;
      c.classList.toggle("on", on);
      c.classList.toggle("cursor", i === cursor);
      c.querySelector(".candpick").setAttribute("aria-checked", on ? "true" : "false");
    });
    document.getElementById("cand-page").textContent = "page " + (page + 1) + " of " + open;
    document.getElementById("cand-prev").disabled = page === 0;
    const next = document.getElementById("cand-next");
    next.disabled = page >= nPages - 1;
    next.title = page < open - 1 ? "Next page (PageDown)" : "Open more candidates (PageDown)";
    next.setAttribute("aria-label", page < open - 1 ? "Next page of candidates" : "More candidates");
    const more = document.getElementById("cand-more");
    more.textContent = open === nPages ? (nPages > 1 ? "all " + cands.length + " candidates shown" : "")
      : "a tick opens the next " + (ahead > 1 ? ahead + " pages" : "page") + "; › opens more (up to " + cands.length + ")";
    // ticks, and how many of the pool the open pages show (the rest open only after ticks)
    const shown = Math.min(cands.length, open * pageSize);
    document.getElementById("cand-count").innerHTML = (noneFit && !ticks.size ? "<b>none of these fit</b>"
      : "<b>" + ticks.size + "</b> ticked") + (shown < cands.length ? " · " + shown + " of " + cands.length + " shown" : "");
    document.getElementById("none-fit").classList.toggle("on", noneFit && !ticks.size);
    // The rubric's too-broad rule (its too_broad_threshold), stated where its hint appears;
    // the server says when the gallery is too small for the rule to mean anything.
    const hint = document.getElementById("too-broad");
    const rule = payload.too_broad || {};
    const limit = rule.threshold || 0;
    const broad = rubric.categories && rubric.categories.find((c) => c.key === "QUERY_TOO_BROAD");
    const name = broad ? "“" + broad.label + "” (key " + broad.shortcut_key + ")" : "QUERY_TOO_BROAD";
    const fires = limit > 0 && ticks.size >= limit;
    hint.hidden = !limit;
    hint.classList.toggle("on", fires);
    hint.textContent = fires ? "You ticked " + ticks.size + " candidates (" + limit + " or more fit): consider " + name + "."
      : rule.too_small ? rule.too_small
      : name + " when " + limit + " or more images fit as well as the target.";
  }
  function inPanel() { return !!(document.activeElement && document.activeElement.closest("#candgrid")); }
  function moveCursor(to) {
    cursor = Math.max(0, Math.min(Math.min(cands.length, pagesShown() * pageSize) - 1, to));
    renderPanel();
    // the keyboard focus follows the cursor while it is in the panel (Tab reaches every
    // candidate shown; the arrows move between them)
    if (inPanel()) cands[cursor].querySelector(".candpick").focus({ preventScroll: true });
    cands[cursor].scrollIntoView({ block: "nearest" });
  }
  function toggleTick(i) {
    const id = Number(cands[i].dataset.id);
    if (ticks.has(id)) ticks.delete(id); else ticks.add(id);
    if (ticks.size) noneFit = false;
    clearPending = false;
    cursor = i;
    renderPanel(); edited(); hideError();
  }
  // "None fit" clears the ticks: with ticks on the panel the first press only says so, and a
  // second press (with no tick in between) clears them, so one key never drops an answer unseen.
  let clearPending = false;
  function setNoneFit() {
    if (ticks.size && !clearPending) {
      clearPending = true;
      renderPanel();
      document.getElementById("cand-count").innerHTML = "<b>" + ticks.size + "</b> ticked · “None fit” clears "
        + (ticks.size > 1 ? "them" : "it") + ": press it again to confirm";
      return;
    }
    clearPending = false; ticks.clear(); noneFit = true; renderPanel(); edited(); hideError();
  }
  cands.forEach((c, i) => {
    c.addEventListener("click", (ev) => {
      if (ev.target.closest(".cand-zoom")) return; // the zoom button opens the candidate at full size (zoom.js)
      toggleTick(i);
    });
    // a candidate reached with Tab becomes the cursor: Space ticks it, v opens it
    c.querySelector(".candpick").addEventListener("focus", () => { if (cursor !== i) { cursor = i; renderPanel(); } });
  });
  if (cands.length) {
    document.getElementById("cand-prev").addEventListener("click", () => moveCursor((Math.floor(cursor / pageSize) - 1) * pageSize));
    document.getElementById("cand-next").addEventListener("click", () => nextPage(false));
    document.getElementById("none-fit").addEventListener("click", setNoneFit);
  }
  function panelKey(k) {
    if (!cands.length) return false;
    const cols = panelColumns();
    const moves = { ArrowRight: 1, ArrowLeft: -1, ArrowDown: cols, ArrowUp: -cols, PageDown: pageSize, PageUp: -pageSize };
    if (k === "PageDown") { nextPage(true); return true; } // the next page, or one more opened at will
    if (k in moves) { moveCursor(cursor + moves[k]); return true; }
    if (k === " ") {
      // Space on a focused button presses that button; anywhere else it ticks the cursor
      if (document.activeElement && document.activeElement.matches("button, a, summary, input")) return false;
      toggleTick(cursor); return true;
    }
    if (k === "0") { setNoneFit(); return true; }
    return false;
  }

  function newToken() {
    if (window.crypto && crypto.randomUUID) return crypto.randomUUID();
    return "t" + Date.now().toString(36) + Math.random().toString(36).slice(2);
  }
  function spent() { return elapsed + (shownAt ? Date.now() - shownAt : 0); }
  document.addEventListener("visibilitychange", () => {
    if (document.visibilityState === "visible") shownAt = Date.now();
    else if (shownAt) { elapsed += Date.now() - shownAt; shownAt = null; saveDraft(true); }
  });
  const timer = document.getElementById("timer");
  setInterval(() => {
    const s = Math.floor(spent() / 1000);
    timer.textContent = Math.floor(s / 60) + ":" + String(s % 60).padStart(2, "0");
    timer.classList.toggle("late", s >= 120);
  }, 500);

  // ---- reading and writing the form ------------------------------------------
  function checked(name) { const el = form.querySelector(`input[name="${name}"]:checked`); return el ? el.value : null; }
  function current() {
    const data = { note: note.value, flagged: flagged.checked, client_token: token, elapsed_ms: spent(), edited_at: Date.now() };
    if (cands.length) {
      data.alternatives = cands.map((c) => Number(c.dataset.id)).filter((id) => ticks.has(id));
      data.none_fit = noneFit && !ticks.size;
    }
    if (isSession) {
      data.scales = {};
      for (const s of rubric.scales) { const v = checked("scale-" + s.key); if (v !== null) data.scales[s.key] = Number(v); }
      data.per_turn_checks = [];
      for (let t = 0; t < nTurns; t++) {
        const row = {};
        for (const c of rubric.per_turn_checks) row[c.key] = !!document.querySelector(`input[name="turn-${t}-${c.key}"]:checked`);
        if (turnVerdict && turnVerdictOf(t) !== null) row[turnVerdict.key] = turnVerdictOf(t);
        data.per_turn_checks.push(row);
      }
      data.reject_flags = rubric.reject_flags.filter((c) => form.querySelector(`input[name="reject-${c.key}"]:checked`)).map((c) => c.key);
    } else {
      data.category = checked("category");
      data.sub_reason = checked("sub_reason");
    }
    return data;
  }
  function setRadio(name, value, scope) {
    const el = (scope || form).querySelector(`input[name="${name}"][value="${CSS.escape(String(value))}"]`);
    if (el) el.checked = true;
  }
  function subBox(categoryKey) { return form.querySelector(`.subs[data-category="${CSS.escape(categoryKey)}"]`); }
  function restore(d) {
    note.value = d.note || "";
    flagged.checked = !!d.flagged;
    if (isSession) {
      for (const [k, v] of Object.entries(d.scales || {})) setRadio("scale-" + k, v);
      (d.per_turn_checks || d.per_turn || []).forEach((row, t) => {
        for (const [k, v] of Object.entries(row)) { const el = document.querySelector(`input[name="turn-${t}-${k}"]`); if (el) el.checked = !!v; }
        if (turnVerdict && typeof row[turnVerdict.key] === "boolean") { const el = verdictInput(t, row[turnVerdict.key]); if (el) el.checked = true; }
      });
      for (const k of d.reject_flags || []) { const el = form.querySelector(`input[name="reject-${k}"]`); if (el) el.checked = true; }
    } else {
      if (d.category) setRadio("category", d.category);
      showSubs();
      if (d.category && d.sub_reason) setRadio("sub_reason", d.sub_reason, subBox(d.category));
    }
    refresh();
  }

  // ---- category rubric: sub-reasons follow the chosen category ----------------
  function showSubs() {
    const cat = checked("category");
    form.querySelectorAll(".subs").forEach((box) => {
      const on = box.dataset.category === cat;
      box.hidden = !on;
      if (!on) box.querySelectorAll("input").forEach((i) => { i.checked = false; });
    });
  }
  // the chosen category and its reasons in view inside the rubric's scrolling column (a key
  // choice, a refused submit): what the error names is never scrolled out of sight
  function revealChoice() {
    const cat = form.querySelector('input[name="category"]:checked');
    if (!cat) return;
    const box = subBox(cat.value);
    if (box && !box.hidden) box.scrollIntoView({ block: "nearest" });
    const sub = form.querySelector('input[name="sub_reason"]:checked');
    (sub || cat).closest("label").scrollIntoView({ block: "nearest" });
  }
  function category(key) { return rubric.categories.find((c) => c.key === key); }
  function noteRequired(d) {
    if (isSession) return false;
    const c = category(d.category);
    const s = c && c.sub_reasons.find((x) => x.key === d.sub_reason);
    return !!(s && s.requires_note);
  }
  function problem(d) {
    if (isSession) {
      const missing = rubric.scales.filter((s) => !(s.key in d.scales));
      if (missing.length) return "Rate " + missing.map((s) => s.label).join(", ") + ".";
      if (turnVerdict) {
        const open = d.per_turn_checks.map((row, t) => (turnVerdict.key in row ? null : t + 1)).filter((t) => t !== null);
        if (open.length) {
          activeTurn = open[0] - 1; highlightSession();
          return "Give every turn a verdict (" + turnVerdict.valid_key + " valid, " + turnVerdict.invalid_key +
            " invalid): turn " + open.join(", ") + (open.length > 1 ? " have" : " has") + " none.";
        }
      }
      return null;
    }
    if (!d.category) return "Choose a category (keys " + rubric.categories.map((c) => c.shortcut_key).join(" ") + ").";
    const c = category(d.category);
    if (c.sub_reasons.length && !d.sub_reason) return "Choose a reason for “" + c.label + "”.";
    if (noteRequired(d) && !d.note.trim()) return "“Other” needs a note: say what is wrong (press n).";
    return null;
  }
  function refresh() {
    const d = current();
    // the per-turn checks sit under their turns in the filmstrip, outside the form element
    document.querySelectorAll("#judgement-form label.choice, .turnchecks label.choice").forEach((l) => {
      const i = l.querySelector("input"); l.classList.toggle("on", !!(i && i.checked));
    });
    note.classList.toggle("required", noteRequired(d) && !d.note.trim());
    if (isSession) highlightSession();
  }
  function setTurnVerdict(t, value) {
    const el = verdictInput(t, value);
    if (el) { el.checked = true; form.dispatchEvent(new Event("change")); }
  }

  // ---- session rubric helpers ---------------------------------------------------
  function highlightSession() {
    form.querySelectorAll(".scale").forEach((el) => el.classList.toggle("active", el.dataset.scale === activeScale));
    document.querySelectorAll(".frame").forEach((el) => el.classList.toggle("active", Number(el.dataset.turn) === activeTurn));
    document.querySelectorAll(".turnchecks").forEach((el) => el.classList.toggle("active", Number(el.dataset.turn) === activeTurn));
    if (!turnVerdict) return;
    document.querySelectorAll(".turnverdict label.tv").forEach((l) => l.classList.toggle("on", l.querySelector("input").checked));
    document.querySelectorAll(".frame[data-turn]").forEach((el) => {
      const v = turnVerdictOf(Number(el.dataset.turn));
      el.classList.toggle("tv-valid", v === true);
      el.classList.toggle("tv-invalid", v === false);
    });
  }

  // ---- draft autosave -----------------------------------------------------------
  // The status line says only what is true: "Draft saved." once the server has
  // acknowledged the newest edit, else where the edit is kept and what went wrong.
  let saveTimer = null;
  let retryTimer = null;
  const draftStatus = document.getElementById("draft-status");
  let submitted = false;
  let lastEdit = restoredDraft ? restoredDraft.edited_at || 0 : 0; // edited_at of the newest edit
  const restoredAt = lastEdit;
  let keptLocally = true;
  function say(text, unsaved) { draftStatus.textContent = text; draftStatus.classList.toggle("unsaved", !!unsaved); }
  function where() { return keptLocally ? " It is kept in this browser" : " It is not kept anywhere yet"; }
  function acknowledged(stamp) {
    // The server holds every edit up to ``stamp``: the local copy of those is no longer needed.
    const local = localDraft();
    if (local && typeof stamp === "number" && (local.edited_at || 0) <= stamp) forgetDraft();
    if (typeof stamp === "number" && stamp >= lastEdit) say(lastEdit === restoredAt ? "Draft restored." : "Draft saved.");
  }
  function notSaved(why, retry) {
    say("Draft not saved on the server: " + String(why).replace(/[.\s]+$/, "") + "." + where() +
      (retry ? "; trying again." : "."), true);
    clearTimeout(retryTimer);
    if (retry) retryTimer = setTimeout(() => saveDraft(true), 5000);
  }
  function saveDraft(now) {
    clearTimeout(saveTimer);
    if (submitted || !dirty) return;
    const send = () => {
      clearTimeout(retryTimer);
      const body = Object.assign(current(), { edited_at: lastEdit, pages_opened: opened });
      fetch(urls.draft, { method: "PUT", keepalive: true, credentials: "same-origin",
        headers: { "Content-Type": "application/json", "X-CSRFToken": csrf }, body: JSON.stringify(body) })
        .then(async (r) => {
          const data = await r.json().catch(() => ({}));
          if (submitted) return;
          if (r.ok && data.stale) { forgetDraft(); return; } // this page's answer is already stored
          if (r.ok) { acknowledged(data.edited_at); return; }
          notSaved(data.detail || "the server answered " + r.status, r.status >= 500 || r.status === 429);
        })
        .catch(() => { if (!submitted) notSaved("the server cannot be reached (offline?)", true); });
    };
    if (now) send(); else saveTimer = setTimeout(send, 300);
  }
  function edited() {
    dirty = true;
    const d = current();
    lastEdit = Math.max(d.edited_at, lastEdit + 1);
    d.edited_at = lastEdit;
    d.pages_opened = opened;
    try { localStorage.setItem(localKey, JSON.stringify(d)); keptLocally = true; } catch (e) { keptLocally = false; }
    say(keptLocally ? "Saving the draft…" : "Saving the draft (this browser keeps no copy)…");
    saveDraft();
  }
  function forgetDraft() { try { localStorage.removeItem(localKey); } catch (e) { /* nothing kept */ } }
  window.addEventListener("online", () => saveDraft(true));
  form.addEventListener("change", () => { if (!isSession) showSubs(); refresh(); edited(); hideError(); });
  // The filmstrip's verdict radios are outside the form element: their changes are the form's.
  // A click on a frame makes it the current turn (what the keys act on).
  document.querySelectorAll(".frame[data-turn]").forEach((frame) => {
    frame.addEventListener("change", (ev) => { ev.stopPropagation(); form.dispatchEvent(new Event("change")); });
    frame.addEventListener("click", () => { activeTurn = Number(frame.dataset.turn); refresh(); });
  });
  note.addEventListener("input", () => { refresh(); edited(); });
  window.addEventListener("pagehide", () => saveDraft(true));

  // ---- actions ------------------------------------------------------------------
  function showError(msg) { errorBox.textContent = msg; errorBox.hidden = false; }
  function hideError() { errorBox.hidden = true; }
  // The next item is reserved by a POST (a GET never changes state).
  function goNext() {
    const f = document.createElement("form");
    f.method = "post";
    f.action = urls.next;
    const i = document.createElement("input");
    i.type = "hidden"; i.name = "csrfmiddlewaretoken"; i.value = csrf;
    f.appendChild(i);
    document.body.appendChild(f);
    f.submit();
  }
  function showNotice(id, text) {
    const box = document.getElementById(id);
    box.querySelector(".text").textContent = text;
    box.hidden = false;
    return box;
  }
  function answerText(j) {
    if (!j) return "(nothing)";
    if (isSession) return Object.entries(j.scales || {}).map(([k, v]) => k + " " + v).join(", ") + (j.note ? " · " + j.note : "");
    return [j.category, j.sub_reason].filter(Boolean).join(" / ") + (j.note ? " · " + j.note : "");
  }
  function showConflict(err) {
    const box = showNotice("conflict", err.detail || "This item changed elsewhere.");
    box.querySelector(".stored").textContent = answerText(err.stored) + (err.stored ? " (revision " + err.stored.revision + ")" : "");
    box.querySelector(".yours").textContent = answerText(current());
    box.dataset.storedRevision = err.stored ? err.stored.revision : 0;
    document.getElementById("conflict-mine").focus();
  }
  function keepMine() {
    const box = document.getElementById("conflict");
    baseRevision = Number(box.dataset.storedRevision || 0);
    token = newToken(); // a new answer: a new token
    box.hidden = true;
    submit();
  }
  function keepStored() { submitted = true; clearTimeout(saveTimer); forgetDraft(); goNext(); }
  function submitted201(data) {
    submitted = true;
    clearTimeout(saveTimer);
    forgetDraft();
    if (!data.late) { goNext(); return; }
    afterLate = true;
    showNotice("late-notice", "Your reservation had run out and this item went to someone else. Your answer is stored, " +
      "marked late; it does not count twice towards the item's quorum. Press Enter for the next item.");
  }
  async function submit() {
    if (afterLate) { goNext(); return; }
    if (busy) return;
    const d = current();
    const p = problem(d);
    if (p) {
      showError(p);
      if (noteRequired(d)) note.focus(); // first: the note grows when focused, and the column shrinks
      if (!isSession) revealChoice();
      return;
    }
    busy = true;
    const body = Object.assign({}, d, { time_spent_ms: Math.round(d.elapsed_ms), base_revision: baseRevision });
    delete body.elapsed_ms;
    delete body.edited_at;
    try {
      const r = await fetch(urls.submit, { method: "POST", credentials: "same-origin",
        headers: { "Content-Type": "application/json", "X-CSRFToken": csrf }, body: JSON.stringify(body) });
      const data = await r.json().catch(() => ({}));
      if (r.status === 200 || r.status === 201) { submitted201(data); return; }
      busy = false;
      if (r.status === 409) { showConflict(data); return; }
      showError(data.detail || "The server refused the judgement (" + r.status + ").");
      return;
    } catch (e) {
      showError("Could not reach the server; your answer is kept. Press Enter to try again.");
    }
    busy = false;
  }
  async function skip() {
    if (busy) return;
    busy = true;
    await fetch(urls.skip, { method: "POST", credentials: "same-origin", headers: { "X-CSRFToken": csrf } }).catch(() => null);
    goNext();
  }
  function back() { if (urls.back) window.location.assign(urls.back); }
  const help = document.getElementById("help");
  function toggleHelp() { help.hidden = !help.hidden; }
  document.getElementById("submit-btn").addEventListener("click", submit);
  document.getElementById("skip-btn").addEventListener("click", skip);
  document.getElementById("help-btn").addEventListener("click", toggleHelp);
  help.addEventListener("click", toggleHelp);
  document.getElementById("conflict-mine").addEventListener("click", keepMine);
  document.getElementById("conflict-stored").addEventListener("click", keepStored);

  // ---- lease: a heartbeat while the annotator is active, a warning before expiry --------
  // The page beats every heartbeat_seconds (a third of the lease at most: server side,
  // annotation.judging.payloads.lease_config) while its annotator is active, so the lease
  // never lapses while the page is in use, and the countdown shows only once nothing keeps
  // the lease: the annotator idle (renewal paused) or the beats failing.
  const leaseBox = document.getElementById("lease-warning");
  const beatMs = leaseCfg.heartbeat_seconds * 1000;
  let lastActivity = Date.now();
  let leaseEnds = payload.lease_seconds != null ? Date.now() + payload.lease_seconds * 1000 : null;
  let leaseHeld = payload.status === "reserved";
  let lastBeat = 0; // when the server last renewed the lease for this page
  let beating = false;
  function leaseLeft() { return leaseEnds === null ? Infinity : leaseEnds - Date.now(); }
  function idle() { return Date.now() - lastActivity > leaseCfg.idle_seconds * 1000; }
  function beatsKeepLease() { return leaseHeld && !idle() && Date.now() - lastBeat < 2 * beatMs + 2000; }
  async function heartbeat() {
    if (submitted || !leaseHeld || beating) return;
    beating = true;
    try {
      const r = await fetch(urls.lease, { method: "POST", credentials: "same-origin", headers: { "X-CSRFToken": csrf } });
      if (!r.ok) return;
      const d = await r.json();
      leaseHeld = d.held;
      leaseEnds = d.held ? Date.now() + d.lease_seconds * 1000 : Date.now();
      if (d.held) lastBeat = Date.now();
      showLease(d);
    } catch (e) { /* offline: try again on the next beat */ } finally { beating = false; }
  }
  // Once the server has said that a submit would now be late, that notice stays (nothing
  // overwrites it) until the annotator has read it and pressed "Got it".
  let lateTold = false;
  let lateRead = false;
  const leaseAck = document.getElementById("lease-ack");
  leaseAck.addEventListener("click", () => { lateRead = true; leaseBox.hidden = true; });
  function showLease(d) {
    const left = leaseLeft();
    if (!leaseHeld && d && d.late) lateTold = true;
    leaseAck.hidden = !lateTold;
    if (lateTold) {
      if (lateRead) return;
      showNotice("lease-warning", "Your reservation ran out and this item went to someone else. You can still submit: " +
        "your answer will be stored, marked late.");
      leaseBox.setAttribute("role", "alert");
    } else if (left <= 0) {
      showNotice("lease-warning", "Your reservation has run out. Submit now to keep your answer.");
    } else if (left <= leaseCfg.warn_seconds * 1000 && !beatsKeepLease()) {
      const s = Math.ceil(left / 1000);
      showNotice("lease-warning", "Your reservation of this item ends in " + Math.floor(s / 60) + ":" + String(s % 60).padStart(2, "0") +
        ". Press a key or move the mouse to keep it.");
    } else {
      leaseBox.hidden = true;
    }
  }
  function active() {
    const wasIdle = idle();
    lastActivity = Date.now();
    // back from idle, or a beat due: renew now (the periodic beat may be up to a period away)
    if (leaseHeld && (wasIdle || Date.now() - lastBeat >= beatMs)) heartbeat();
  }
  ["keydown", "mousedown", "mousemove", "input", "wheel", "touchstart"].forEach((t) =>
    document.addEventListener(t, active, { passive: true, capture: true }));
  if (leaseHeld) {
    setInterval(() => { if (!idle()) heartbeat(); }, beatMs); // renewal pauses once the annotator is idle
    setInterval(() => { if (!submitted) showLease(null); }, 1000);
  }

  // ---- keyboard -----------------------------------------------------------------
  function pressKey(input) { if (input) { input.checked = !input.checked || input.type === "radio"; form.dispatchEvent(new Event("change")); } }
  document.addEventListener("keydown", (ev) => {
    if (ev.altKey || ev.metaKey) return;
    if (ev.target === note) {
      if (ev.key === "Escape") { note.blur(); ev.preventDefault(); }
      else if (ev.key === "Enter" && ev.ctrlKey) { ev.preventDefault(); submit(); }
      return;
    }
    if (ev.ctrlKey) return;
    // a notice's own buttons ("Keep mine", "Got it") answer Enter and Space themselves
    if ((ev.key === "Enter" || ev.key === " ") && ev.target.closest && ev.target.closest(".notice button")) return;
    const k = ev.key.length === 1 ? ev.key.toLowerCase() : ev.key;
    if (k === "Escape" && !help.hidden) { toggleHelp(); return; }
    if (k === "?") { toggleHelp(); ev.preventDefault(); return; }
    if (k === "Enter") { ev.preventDefault(); submit(); return; }
    if (k === "n") { note.focus(); ev.preventDefault(); return; }
    if (k === "f") { flagged.checked = !flagged.checked; form.dispatchEvent(new Event("change")); return; }
    if (k === "s") { skip(); return; }
    if (k === "b") { back(); return; }
    if (isSession) {
      const scale = rubric.scales.find((s) => (s.shortcut_key || "").toLowerCase() === k);
      if (scale) { activeScale = scale.key; refresh(); return; }
      if (/^[0-9]$/.test(k) && activeScale) { setRadio("scale-" + activeScale, k); form.dispatchEvent(new Event("change")); return; }
      if (k === "ArrowRight" || k === "ArrowLeft") { activeTurn = Math.max(0, Math.min(nTurns - 1, activeTurn + (k === "ArrowRight" ? 1 : -1))); refresh(); ev.preventDefault(); return; }
      if (turnVerdict && (k === turnVerdict.valid_key.toLowerCase() || k === turnVerdict.invalid_key.toLowerCase())) {
        setTurnVerdict(activeTurn, k === turnVerdict.valid_key.toLowerCase()); ev.preventDefault(); return;
      }
      const check = rubric.per_turn_checks.find((c) => (c.shortcut_key || "").toLowerCase() === k);
      if (check) { pressKey(document.querySelector(`input[name="turn-${activeTurn}-${check.key}"]`)); return; }
      const rej = rubric.reject_flags.find((c) => (c.shortcut_key || "").toLowerCase() === k);
      if (rej) { pressKey(form.querySelector(`input[name="reject-${rej.key}"]`)); return; }
      return;
    }
    if (panelKey(ev.key)) { ev.preventDefault(); return; }
    const cat = rubric.categories.find((c) => c.shortcut_key.toLowerCase() === k);
    if (cat) { ev.preventDefault(); setRadio("category", cat.key); form.dispatchEvent(new Event("change")); revealChoice(); return; }
    const chosen = category(checked("category"));
    const sub = chosen && chosen.sub_reasons.find((s) => s.shortcut_key.toLowerCase() === k);
    if (sub) {
      ev.preventDefault(); // the key must not land in the note it may focus
      setRadio("sub_reason", sub.key, subBox(chosen.key));
      form.dispatchEvent(new Event("change"));
      if (sub.requires_note && !note.value.trim()) note.focus();
      revealChoice();
    }
  });

  // ---- start ----------------------------------------------------------------------
  restore(start);
  renderPanel();
  if (restoredDraft) {
    dirty = true;
    say("Draft restored.");
    // A local edit the server never acknowledged (a lost request, a reload, a crash) is sent now.
    if (restoredDraft !== payload.draft) saveDraft(true); else acknowledged(restoredAt);
  } else if (localDraft()) {
    forgetDraft(); // older than the stored judgement: stale
  }
  if (leaseHeld) heartbeat(); // the page opened: the lease is renewed from now, the countdown hidden
  // Warm the browser cache with the images of the item most likely served next.
  fetch(urls.upcoming, { credentials: "same-origin" }).then((r) => (r.ok ? r.json() : { images: [] }))
    .then((d) => d.images.forEach((src) => { const img = new Image(); img.src = src; })).catch(() => null);
})();
