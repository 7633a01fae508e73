// fvd dashboard: keeps a server-rendered page live. The server sends the
// page's changed sections over server-sent events (same markup as a reload);
// this swaps them in, follows a running job's output, and posts answers.
// No framework, no build step, nothing fetched from elsewhere.
(function () {
  "use strict";
  const live = document.getElementById("live");
  function state(ok, text) {
    if (!live) return;
    live.textContent = text;
    live.className = ok ? "on" : "off";
  }
  // Every section swap, for scripts and the browser test:
  // {id, event_us, applied_ms} (event_us: when the change reached the server).
  window.fvdUpdates = [];

  function apply(e) {
    const u = JSON.parse(e.data);
    for (const s of u.sections) {
      const el = document.getElementById(s.id);
      if (!el || el.dataset.hash === s.hash) continue;
      if (u.event_us) el.dataset.eventUs = String(u.event_us);
      el.dataset.hash = s.hash;
      el.innerHTML = s.html;
      window.fvdUpdates.push({
        id: s.id,
        event_us: u.event_us,
        applied_ms: performance.timeOrigin + performance.now(),
      });
    }
    bindForms();
  }

  const url = document.body.dataset.events;
  if (url) {
    const es = new EventSource(url);
    es.onopen = () => state(true, "● live");
    es.onerror = () => state(false, "○ reconnecting");
    es.addEventListener("sections", apply);
    es.addEventListener("gone", () => {
      state(false, "○ gone");
      es.close();
    });
  } else {
    state(false, "");
  }

  const log = document.getElementById("log");
  // A line asked for (`#L12`, a search hit's link) is shown; else the end.
  const asked = location.hash.startsWith("#L") && document.getElementById(location.hash.slice(1));
  if (log && asked && log.contains(asked)) asked.scrollIntoView({ block: "center" });
  else if (log) log.scrollTop = log.scrollHeight;
  if (log && log.dataset.follow) {
    const ls = new EventSource(log.dataset.follow);
    ls.addEventListener("log", (e) => {
      const atEnd = log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
      log.append(JSON.parse(e.data));
      if (atEnd) log.scrollTop = log.scrollHeight;
    });
    ls.addEventListener("end", () => {
      ls.close();
      const f = document.querySelector(".following");
      if (f) f.textContent = "ended";
    });
  }

  function bindForms() {
    for (const f of document.querySelectorAll("form.answer:not([data-bound])")) {
      f.dataset.bound = "1";
      f.addEventListener("submit", async (ev) => {
        ev.preventDefault();
        const out = f.querySelector("output");
        const body = new URLSearchParams(new FormData(f));
        out.className = "result";
        out.textContent = "sending…";
        try {
          const r = await fetch(f.action, {
            method: "POST",
            body,
            headers: { Accept: "application/json" },
          });
          const j = await r.json();
          const token = f.querySelector("input[name=token]");
          if (token) token.value = "";
          if (r.ok) {
            out.className = "result ok";
            out.textContent = "answered: " + j.escape.answer;
            f.querySelector("button").disabled = true;
          } else {
            out.className = "result err";
            out.textContent = j.error;
          }
        } catch (err) {
          out.className = "result err";
          out.textContent = String(err);
        }
      });
    }
  }
  bindForms();

  // Filters: a state chosen hides the other rows of the section it is for
  // (CSS on the section's `data-filter`, which its live updates keep), and
  // is kept in the URL as `?show=STATE`.
  const params = new URLSearchParams(location.search);
  for (const nav of document.querySelectorAll("nav.filter")) {
    const target = document.getElementById(nav.dataset.filterFor);
    if (!target) continue;
    const choose = (value) => {
      if (value) target.dataset.filter = value;
      else delete target.dataset.filter;
      for (const b of nav.querySelectorAll("button")) {
        b.setAttribute("aria-pressed", String(b.dataset.value === value));
      }
      const p = new URLSearchParams(location.search);
      if (value) p.set("show", value);
      else p.delete("show");
      const q = p.toString();
      history.replaceState(null, "", location.pathname + (q ? "?" + q : ""));
    };
    for (const b of nav.querySelectorAll("button")) {
      b.addEventListener("click", () => choose(b.dataset.value));
    }
    choose(params.get("show") || "");
  }
})();
