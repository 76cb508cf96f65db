// Agent-Reach console: progressive enhancement only. Every page works without this script;
// with it, a task's timeline and step tree follow the task live, and edited arguments are
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

  // Server-Sent Events read over fetch: any event name, cookies sent, and a resume with
  // Last-Event-ID after a dropped connection (the stream's contract, see /v1 docs).
  async function follow(table) {
    const task = table.dataset.task;
    const tbody = table.tBodies[0];
    const live = document.getElementById("live");
    let last = Number(table.dataset.after || "0");
    let pause = 500;
    const say = (text) => { if (live) live.textContent = text; };
    for (;;) {
      let ended = false;
      try {
        const headers = { Accept: "text/event-stream" };
        if (last > 0) headers["Last-Event-ID"] = String(last);
        const answer = await fetch("/v1/tasks/" + encodeURIComponent(task) + "/events?after=" + last,
          { headers: headers, credentials: "same-origin", cache: "no-store" });
        if (answer.status === 401) { say("(signed out: reload to sign in)"); return; }
        if (!answer.ok || !answer.body) throw new Error("stream " + answer.status);
        say("(live)");
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
            const block = buffer.slice(0, cut);
            buffer = buffer.slice(cut + 2);
            const message = parse(block);
            if (!message) continue;
            if (message.event === "end") {
              ended = true;
              finish(message.data);
            } else {
              if (message.id) last = Math.max(last, Number(message.id));
              if (message.data) appendEvent(tbody, message.data);
              refreshSteps();
            }
          }
        }
      } catch (err) {
        say("(reconnecting…)");
      }
      if (ended) { say("(finished)"); refreshSteps(); refreshSections(["summary", "dry-run-section"]); return; }
      await new Promise((r) => setTimeout(r, pause));
      pause = Math.min(pause * 2, 10000);
    }
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

  // Once a task has ended, its summary (actions, finish time) and dry run are re-read.
  async function refreshSections(ids) {
    const answer = await fetch(location.pathname, { credentials: "same-origin", cache: "no-store" });
    if (!answer.ok) return;
    const doc = new DOMParser().parseFromString(await answer.text(), "text/html");
    for (const id of ids) {
      const fresh = doc.getElementById(id);
      const here = document.getElementById(id);
      if (fresh && here) here.replaceWith(document.importNode(fresh, true));
    }
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
    if (table && table.dataset.terminal !== "yes") follow(table);
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
