// The interactive session page: the annotator plays the user of a retriever. Enter sends the
// feedback (the server stores the round and a worker re-ranks); the page polls the state
// until the round is ranked, then shows the results. Keys pick and inspect a result.
(function () {
  "use strict";
  const csrf = document.querySelector("meta[name=csrf-token]").content;
  const urls = JSON.parse(document.getElementById("urls").textContent);
  let state = JSON.parse(document.getElementById("iact-state").textContent);
  const $ = (id) => document.getElementById(id);
  const input = $("feedback");
  const status = $("status");
  let picked = 0; // index into the last round's results
  let started = Date.now();
  let polling = null;

  function lastRound() { return state.rounds.length ? state.rounds[state.rounds.length - 1] : null; }
  function results() { const r = lastRound(); return r && r.status === "done" ? r.shown : []; }
  function pending() { const r = lastRound(); return !!r && r.status === "pending"; }

  function pickedImage() {
    const shown = results();
    return shown.length ? shown[Math.min(picked, shown.length - 1)] : state.start;
  }

  function renderHistory() {
    const ol = $("history");
    ol.textContent = "";
    for (const r of state.rounds) {
      const li = document.createElement("li");
      const img = document.createElement("img");
      img.src = r.reference ? r.reference.thumb : "";
      img.alt = "round " + r.index + " image";
      const text = document.createElement("span");
      text.textContent = r.text;
      li.append(img, text);
      ol.append(li);
    }
    if (!state.rounds.length) {
      const li = document.createElement("li");
      li.className = "muted small";
      li.style.listStyle = "none";
      li.textContent = "nothing yet";
      ol.append(li);
    }
  }

  function renderResults() {
    const grid = $("results");
    grid.textContent = "";
    const shown = results();
    shown.forEach((img, i) => {
      const cell = document.createElement("div");
      cell.className = "iact-cand" + (i === picked ? " picked" : "");
      cell.setAttribute("role", "option");
      cell.setAttribute("aria-selected", i === picked ? "true" : "false");
      cell.dataset.index = String(i);
      cell.dataset.id = String(img.id);
      const im = document.createElement("img");
      im.src = img.thumb;
      im.alt = "result " + (i + 1);
      const num = document.createElement("span");
      num.className = "num";
      num.textContent = String((i + 1) % 10);
      cell.append(im, num);
      cell.addEventListener("click", () => { pick(i); input.focus(); });
      cell.addEventListener("dblclick", () => { pick(i); inspect(); });
      grid.append(cell);
    });
    const r = lastRound();
    $("results-title").textContent = !r ? "Results appear here after your first feedback"
      : pending() ? "Ranking…" : "Top " + shown.length + " after round " + r.index + " — pick the one to talk about next";
  }

  function renderPicked() {
    const img = pickedImage();
    $("picked-img").src = img ? img.thumb : "";
    $("picked-caption").textContent = results().length ? "Result " + (picked + 1) + " (your next feedback is about it)" : "Start image";
  }

  function render() {
    const n = state.rounds.length;
    const done = state.rounds.filter((r) => r.status === "done").length;
    $("round-no").textContent = String(Math.min(state.ended ? done : done + 1, state.max_rounds));
    renderHistory();
    renderResults();
    renderPicked();
    const r = lastRound();
    const failed = !!r && r.status === "failed";
    $("retry").hidden = !failed;
    input.disabled = pending() || state.ended || failed;
    $("send").disabled = input.disabled;
    status.textContent = pending() ? (state.no_worker || state.warming || "The retriever is re-ranking…")
      : failed ? "Ranking failed: " + r.error : state.warming || "";
    status.classList.toggle("error", pending() && !!state.no_worker);
    $("ended").hidden = !state.ended;
    $("feedback-form").hidden = state.ended;
    if (state.ended) {
      $("ended-text").textContent = state.found
        ? "Found: your target is among the first " + state.top_n + " results after round " + n + "."
        : "Not found after " + n + " rounds. Thank you, the session is saved.";
      $("next").focus();
    } else if (!input.disabled && document.activeElement !== input && !helpOpen()) {
      input.focus();
    }
    document.body.dataset.rounds = String(n);
    document.body.dataset.pending = pending() ? "1" : "0";
    document.body.dataset.ended = state.ended ? "1" : "0";
  }

  function pick(i) {
    const shown = results();
    if (!shown.length) return;
    picked = Math.max(0, Math.min(shown.length - 1, i));
    renderResults();
    renderPicked();
  }

  async function call(url, body) {
    const r = await fetch(url, {
      method: body === undefined ? "GET" : "POST", credentials: "same-origin",
      headers: { "Content-Type": "application/json", "X-CSRFToken": csrf },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const data = await r.json().catch(() => ({}));
    return { ok: r.ok, data };
  }

  function poll() {
    if (polling) return;
    polling = setInterval(async () => {
      const { ok, data } = await call(urls.state).catch(() => ({ ok: false }));
      if (!ok) return;
      state = data;
      if (!pending() && !state.warming) {
        clearInterval(polling);
        polling = null;
        picked = 0;
        started = Date.now();
        render();
      }
    }, 250);
  }

  async function send() {
    if (input.disabled || state.ended) return;
    const text = input.value.trim();
    if (!text) { status.textContent = "Type your feedback first."; return; }
    const img = pickedImage();
    input.disabled = true;
    status.textContent = "Sending…";
    const { ok, data } = await call(urls.rounds, { text, reference: img ? img.id : null, time_spent_ms: Date.now() - started })
      .catch(() => ({ ok: false, data: { detail: "The server cannot be reached; try again." } }));
    if (!ok) {
      input.disabled = false;
      input.focus();
      status.textContent = data.detail || "Not sent.";
      return;
    }
    input.value = "";
    state = data;
    render();
    poll();
  }

  function inspect() {
    const img = pickedImage();
    if (!img) return;
    $("inspect-img").src = img.url;
    $("inspect").hidden = false;
  }
  function closeViews() { $("inspect").hidden = true; $("help").hidden = true; }
  function helpOpen() { return !$("help").hidden || !$("inspect").hidden; }

  $("feedback-form").addEventListener("submit", (e) => { e.preventDefault(); send(); });
  $("retry").addEventListener("click", async () => {
    const { ok, data } = await call(urls.retry, {});
    if (ok) { state = data; render(); poll(); }
  });

  document.addEventListener("keydown", (e) => {
    const typing = document.activeElement === input;
    const key = e.key;
    if (key === "Escape") {
      if (helpOpen()) closeViews(); else if (typing) input.blur();
      e.preventDefault();
      return;
    }
    if (!typing && key === "?") { $("help").hidden = !$("help").hidden; e.preventDefault(); return; }
    const direct = e.altKey || !typing;
    if (!direct || e.ctrlKey || e.metaKey) return;
    if (/^[0-9]$/.test(key) || (e.altKey && /^Digit[0-9]$/.test(e.code))) {
      const d = Number(/^[0-9]$/.test(key) ? key : e.code.slice(5));
      pick(d === 0 ? 9 : d - 1);
      e.preventDefault();
    } else if (key === "ArrowLeft" || key === "ArrowRight") {
      pick(picked + (key === "ArrowLeft" ? -1 : 1));
      e.preventDefault();
    } else if (key === "i" || (e.altKey && e.code === "KeyI")) {
      if ($("inspect").hidden) inspect(); else closeViews();
      e.preventDefault();
    } else if (!typing && key === "/") {
      closeViews();
      input.focus();
      e.preventDefault();
    } else if (!typing && key === "Enter" && !state.ended && !helpOpen()) {
      input.focus();
      e.preventDefault();
    }
  });

  // Keep the lease while the page is open (the server's heartbeat rule).
  // A beat every heartbeat_seconds, well inside the lease (annotation.judging.payloads.lease_config).
  const leaseCfg = JSON.parse(document.getElementById("lease-config").textContent);
  setInterval(() => { if (!state.ended) fetch(urls.lease, { method: "POST", credentials: "same-origin", headers: { "X-CSRFToken": csrf } }).catch(() => null); },
    leaseCfg.heartbeat_seconds * 1000);

  render();
  if (pending() || state.warming) poll(); // while the retriever warms, the page says so until it is ready
})();
