// Agent-Reach console: progressive enhancement only. Every page works without this script;
// with it, a task's timeline and step tree follow the task live, a run's page follows the run
// (its conversation, its rounds' steps, what it waits for), and edited arguments are
// checked as JSON before they are sent. No third-party code, no inline script (the CSP forbids it).
"use strict";

(function () {
  const TERMINAL = new Set(["succeeded", "failed", "cancelled"]);

  function utc(iso) {
    const d = new Date(iso);
    if (Number.isNaN(d.getTime())) return iso || "";
    return d.toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC").replace(/Z$/, " UTC");
  }

  function cell(row, text) {
    const td = document.createElement("td");
    td.textContent = text == null ? "" : String(text);
    row.appendChild(td);
    return td;
  }

  function whoAndWhy(data) {
    if (!data) return "";
    let text = data.by ? String(data.by) : "";
    if (data.reason) text += (text ? ": " : "") + String(data.reason);
    if (data.error && typeof data.error === "object") {
      text += " " + String(data.error.message || data.error.code || "");
    }
    return text.trim();
  }

  function appendEvent(tbody, e) {
    const row = document.createElement("tr");
    cell(row, e.id);
    cell(row, utc(e.created_at));
    const step = cell(row, e.step_id || "");
    if (e.attempt) {
      const n = document.createElement("span");
      n.className = "muted";
      n.textContent = " #" + e.attempt;
      step.appendChild(n);
    }
    cell(row, e.kind);
    cell(row, e.to_status ? (e.from_status || "") + " → " + e.to_status : "");
    cell(row, whoAndWhy(e.data));
    tbody.appendChild(row);
  }

  // One Server-Sent Events stream read over fetch: any event name, cookies sent, and a resume
  // with Last-Event-ID after a dropped connection (the streams' contract, see /v1 docs), until
  // it sends `end` or is stopped. `url(last)` is where to read after the event id `last`.
  function stream(url, last, on) {
    const control = new AbortController();
    let stopped = false;
    (async () => {
      let pause = 500;
      while (!stopped) {
        let ended = false;
        try {
          const headers = { Accept: "text/event-stream" };
          if (last > 0) headers["Last-Event-ID"] = String(last);
          const answer = await fetch(url(last), {
            headers: headers, credentials: "same-origin", cache: "no-store", signal: control.signal,
          });
          if (answer.status === 401) { on.say("(signed out: reload to sign in)"); return; }
          if (!answer.ok || !answer.body) throw new Error("stream " + answer.status);
          on.say("(live)");
          pause = 500;
          const reader = answer.body.getReader();
          const decoder = new TextDecoder();
          let buffer = "";
          for (;;) {
            const chunk = await reader.read();
            if (chunk.done) break;
            buffer += decoder.decode(chunk.value, { stream: true }).replace(/\r\n/g, "\n");
            let cut;
            while ((cut = buffer.indexOf("\n\n")) >= 0) {
              const message = parse(buffer.slice(0, cut));
              buffer = buffer.slice(cut + 2);
              if (!message) continue;
              if (message.event === "end") ended = true;
              else if (message.id) last = Math.max(last, Number(message.id));
              on.event(message);
            }
          }
        } catch (err) {
          if (stopped) return;
          on.say("(reconnecting…)");
        }
        if (ended) { on.ended(); return; }
        await new Promise((r) => setTimeout(r, pause));
        pause = Math.min(pause * 2, 10000);
      }
    })();
    return () => { stopped = true; control.abort(); };
  }

  function sayer(element) {
    return (text) => { if (element) element.textContent = text; };
  }

  // A task's page: its timeline grows event by event, its steps are re-read as they move.
  function followTask(table) {
    const tbody = table.tBodies[0];
    const say = sayer(document.getElementById("live"));
    const url = (last) => "/v1/tasks/" + encodeURIComponent(table.dataset.task) + "/events?after=" + last;
    stream(url, Number(table.dataset.after || "0"), {
      say: say,
      event(message) {
        if (message.event === "end") { finish(message.data); return; }
        if (message.data) appendEvent(tbody, message.data);
        refreshSteps();
      },
      ended() { say("(finished)"); refreshSteps(); refreshSections(["summary", "dry-run-section"]); },
    });
  }

  // A run's page follows the run (its conversation, its status, its rounds) and the task of its
  // current round (its calls' steps moving, one waiting for approval), and re-reads its sections.
  const RUN_SECTIONS = ["run-summary", "answer-section", "waiting", "conversation", "rounds"];

  function followRun(live) {
    const say = sayer(live);
    const refresh = serially(() => refreshSections(RUN_SECTIONS, true));
    for (const id of RUN_SECTIONS) {
      const here = document.getElementById(id);
      if (here) shownHtml.set(id, here.innerHTML);
    }
    let task = "";
    let stopTask = null;
    const watch = (id) => {
      if (id === task) return;
      if (stopTask) stopTask();
      task = id;
      stopTask = id ? stream((last) => "/v1/tasks/" + encodeURIComponent(id) + "/events?after=" + last,
        0, { say() {}, event: refresh, ended: refresh }) : null;
    };
    watch(live.dataset.task || "");
    let state = "";
    stream(() => "/v1/runs/" + encodeURIComponent(live.dataset.run) + "/events",
      Number(live.dataset.after || "0"), {
        say: say,
        event(message) {
          const data = message.data || {};
          if (message.event !== "status") { refresh(); return; }
          watch(data.task_id || "");
          const now = [data.status, data.round, data.task_id].join(" ");
          if (now !== state) { state = now; refresh(); }
        },
        ended() { say("(finished)"); watch(""); refresh(); },
      });
  }

  // At most one re-read at a time, a quarter second after the last ask: in order, never stale.
  function serially(work) {
    let timer = null;
    let chain = Promise.resolve();
    return () => {
      if (timer) return;
      timer = setTimeout(() => { timer = null; chain = chain.then(work, work); }, 250);
    };
  }

  function parse(block) {
    const message = { event: "message", id: null, data: null };
    const lines = [];
    for (const line of block.split("\n")) {
      if (!line || line.startsWith(":")) continue;
      const colon = line.indexOf(":");
      const field = colon < 0 ? line : line.slice(0, colon);
      const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
      if (field === "event") message.event = value;
      else if (field === "id") message.id = value;
      else if (field === "data") lines.push(value);
    }
    if (!lines.length) return null;
    try { message.data = JSON.parse(lines.join("\n")); } catch (e) { return null; }
    return message;
  }

  function finish(data) {
    const status = document.getElementById("task-status");
    if (status && data && data.status) {
      status.textContent = data.status;
      status.className = "status s-" + data.status;
    }
  }

  let pending = null;
  function refreshSteps() {
    const holder = document.getElementById("steps");
    if (!holder || pending) return;
    pending = setTimeout(async () => {
      pending = null;
      const open = new Set(Array.from(holder.querySelectorAll("li[data-step] details[open]"))
        .map((d) => d.closest("li").dataset.step));
      const answer = await fetch("/console/tasks/" + encodeURIComponent(holder.dataset.task) + "/steps",
        { credentials: "same-origin", cache: "no-store" });
      if (!answer.ok) return;
      const doc = new DOMParser().parseFromString(await answer.text(), "text/html");
      const fresh = doc.querySelector("ol.steps");
      if (!fresh) return;
      for (const li of fresh.querySelectorAll("li[data-step]")) {
        const details = li.querySelector("details");
        if (details && open.has(li.dataset.step)) details.open = true;
      }
      holder.replaceChildren(document.importNode(fresh, true));
    }, 250);
  }

  // Sections of this page re-read from the server. With `changedOnly`, a section is replaced only
  // when the server's HTML of it changed, so a form someone is filling in stays as it is.
  const shownHtml = new Map();
  async function refreshSections(ids, changedOnly) {
    const answer = await fetch(location.pathname, { credentials: "same-origin", cache: "no-store" });
    if (!answer.ok) return;
    const doc = new DOMParser().parseFromString(await answer.text(), "text/html");
    for (const id of ids) {
      const fresh = doc.getElementById(id);
      const here = document.getElementById(id);
      if (!fresh || !here) continue;
      if (changedOnly && shownHtml.get(id) === fresh.innerHTML) continue;
      shownHtml.set(id, fresh.innerHTML);
      here.replaceWith(document.importNode(fresh, true));
    }
  }

  // A link to one step of a task (from a run's page) opens that step's details.
  function openLinkedStep() {
    if (!location.hash.startsWith("#step-")) return;
    const step = document.getElementById(decodeURIComponent(location.hash.slice(1)));
    const details = step && step.querySelector("details");
    if (details) details.open = true;
  }

  function checkJson(area) {
    let message = "";
    try { JSON.parse(area.value); } catch (e) { message = "Not JSON: " + e.message; }
    area.setCustomValidity(message);
    area.setAttribute("aria-invalid", message ? "true" : "false");
    return !message;
  }

  document.addEventListener("DOMContentLoaded", () => {
    const table = document.getElementById("timeline");
    if (table && table.dataset.terminal !== "yes") followTask(table);
    const live = document.getElementById("live");
    if (live && live.dataset.run && live.dataset.terminal !== "yes") followRun(live);
    openLinkedStep();
    for (const area of document.querySelectorAll("textarea[data-json]")) {
      area.addEventListener("input", () => checkJson(area));
    }
    for (const form of document.querySelectorAll("form.decide")) {
      form.addEventListener("submit", (event) => {
        const area = form.querySelector("textarea[data-json]");
        const button = event.submitter;
        if (area && button && button.value === "approve" && !checkJson(area)) {
          event.preventDefault();
          area.reportValidity();
        }
      });
    }
  });
})();
