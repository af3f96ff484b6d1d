// mqserver dashboard: polls the JSON API once a second and redraws.
// Plain DOM code with no build step; text goes in through textContent only,
// so queue names, message bodies and error messages can never inject markup.
//
// The bearer token, once typed, is kept in sessionStorage: it survives a
// reload of this tab, is gone when the tab closes, is never shared with
// other tabs or put in the address, and is only sent to this server (the
// page's Content-Security-Policy allows no other destination).
"use strict";

(() => {
  const PERIOD_MS = 1000;
  const TOKEN_KEY = "mqserver-token";
  const PEEK_LIMIT = 20;
  const HISTORY = 60; // points per sparkline: one minute
  const SVG = "http://www.w3.org/2000/svg";
  const queueHistory = new Map(); // queue name -> {depth, publish, deliver}
  const totals = { publish: [], deliver: [] };

  const $ = (id) => document.getElementById(id);
  let token = sessionStorage.getItem(TOKEN_KEY) || "";
  let selected = null; // the queue the detail view shows
  let queueNames = []; // from the last poll, for the move form's targets
  let deadLetterSources = new Map(); // dead-letter queue -> a queue that sends to it

  class AuthError extends Error {}

  // One API call: the decoded answer, AuthError on 401, Error on another
  // failure (a 503 is an answer only where ``allow503``: /health says why).
  async function api(method, path, body, allow503 = false) {
    const headers = {};
    if (token) headers.Authorization = "Bearer " + token;
    const init = { method, headers, cache: "no-store" };
    if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    const response = await fetch(path, init);
    const kind = response.headers.get("content-type") || "";
    const data = kind.startsWith("application/json") ? await response.json() : null;
    if (response.status === 401) throw new AuthError((data && data.error) || "a token is needed");
    if (!response.ok && !(allow503 && response.status === 503)) {
      throw new Error(`HTTP ${response.status}: ${(data && data.error) || path}`);
    }
    return data;
  }

  const queuePath = (name, rest = "") => "api/queues/" + encodeURIComponent(name) + rest;

  function push(list, value) {
    list.push(value);
    if (list.length > HISTORY) list.shift();
  }

  function cell(text, className) {
    const td = document.createElement("td");
    td.textContent = text;
    if (className) td.className = className;
    return td;
  }

  function rate(value) {
    return value >= 100 ? value.toFixed(0) : value.toFixed(1);
  }

  function age(seconds) {
    if (seconds < 1) return "–";
    if (seconds < 120) return seconds.toFixed(0) + " s";
    if (seconds < 7200) return (seconds / 60).toFixed(0) + " min";
    return (seconds / 3600).toFixed(1) + " h";
  }

  // One SVG with a polyline per series, all scaled to the largest value.
  function sparkline(series, width, height) {
    const svg = document.createElementNS(SVG, "svg");
    svg.setAttribute("class", "spark");
    svg.setAttribute("width", width);
    svg.setAttribute("height", height);
    svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
    svg.setAttribute("preserveAspectRatio", "none");
    let max = 1;
    for (const [, values] of series) for (const v of values) max = Math.max(max, v);
    const step = width / (HISTORY - 1);
    for (const [className, values] of series) {
      const offset = HISTORY - values.length;
      const points = values.map((v, i) =>
        `${((offset + i) * step).toFixed(1)},${(height - 1 - (v / max) * (height - 2)).toFixed(1)}`);
      const line = document.createElementNS(SVG, "polyline");
      line.setAttribute("class", className);
      line.setAttribute("vector-effect", "non-scaling-stroke");
      line.setAttribute("points", points.join(" "));
      svg.appendChild(line);
    }
    return svg;
  }

  const getJSON = (path) => api("GET", path, undefined, true);

  function renderOverview(overview) {
    $("ready").textContent = overview.ready;
    $("in-flight").textContent = overview.in_flight;
    $("publish-rate").textContent = rate(overview.rates.publish);
    $("deliver-rate").textContent = rate(overview.rates.deliver);
    $("uptime").textContent = age(overview.uptime);
    push(totals.publish, overview.rates.publish);
    push(totals.deliver, overview.rates.deliver);
    $("total-spark").replaceChildren(
      sparkline([["publish", totals.publish], ["deliver", totals.deliver]], 240, 40));
    const body = document.querySelector("#protocols tbody");
    const rows = Object.entries(overview.connections).map(([protocol, count]) => {
      const tr = document.createElement("tr");
      tr.dataset.protocol = protocol;
      tr.append(cell(protocol), cell(String(count), "num"));
      return tr;
    });
    if (!rows.length) {
      const tr = document.createElement("tr");
      tr.append(cell("none", "muted"), cell("0", "num"));
      rows.push(tr);
    }
    body.replaceChildren(...rows);
  }

  function renderStorage(health) {
    const storage = health.storage;
    const state = $("storage-state");
    state.textContent = storage.ok ? "ok" : "failing";
    state.className = "pill " + (storage.ok ? "ok" : "bad");
    $("storage-backend").textContent =
      storage.backend + (storage.durable ? " (durable)" : " (not durable)");
    $("storage-latency").textContent = (storage.last_batch_seconds * 1000).toFixed(1) +
      " ms, " + storage.last_batch_ops + " ops";
    $("storage-batches").textContent = storage.batches;
    $("storage-failures").textContent = storage.failures;
    const error = $("storage-error");
    error.hidden = !storage.last_error;
    error.textContent = storage.last_error || "";
  }

  function renderQueues(queues) {
    const seen = new Set();
    const rows = queues.map((queue) => {
      seen.add(queue.name);
      let history = queueHistory.get(queue.name);
      if (!history) {
        history = { depth: [], publish: [], deliver: [] };
        queueHistory.set(queue.name, history);
      }
      push(history.depth, queue.depth);
      push(history.publish, queue.rates.publish);
      push(history.deliver, queue.rates.deliver);
      const tr = document.createElement("tr");
      tr.dataset.queue = queue.name;
      const depthSpark = document.createElement("td");
      depthSpark.append(sparkline([["depth", history.depth]], 120, 24));
      const rateSpark = document.createElement("td");
      rateSpark.append(sparkline([["publish", history.publish], ["deliver", history.deliver]],
        120, 24));
      const name = document.createElement("td");
      name.className = "name";
      const open = document.createElement("button");
      open.type = "button";
      open.className = "link open-queue";
      open.dataset.queue = queue.name;
      open.textContent = queue.name;
      name.append(open);
      tr.append(
        name,
        cell(String(queue.depth), "num depth"),
        depthSpark,
        cell(String(queue.in_flight), "num in-flight"),
        cell(String(queue.consumers), "num consumers"),
        cell(rate(queue.rates.publish), "num publish"),
        cell(rate(queue.rates.deliver), "num deliver"),
        cell(rate(queue.rates.ack), "num ack"),
        rateSpark,
        cell(age(queue.oldest_message_age), "num oldest"),
      );
      return tr;
    });
    for (const name of queueHistory.keys()) if (!seen.has(name)) queueHistory.delete(name);
    queueNames = queues.map((queue) => queue.name);
    deadLetterSources = new Map();
    for (const queue of queues) {
      const target = queue.options.dead_letter;
      if (target && !deadLetterSources.has(target)) deadLetterSources.set(target, queue.name);
    }
    document.querySelector("#queues tbody").replaceChildren(...rows);
    $("queue-count").textContent = `(${queues.length})`;
    $("no-queues").hidden = queues.length > 0;
  }

  // One poll of everything shown; ``tick`` repeats it, an action runs one at once.
  async function poll() {
    const status = $("status");
    try {
      const [overview, queues, health] = await Promise.all([
        getJSON("api/overview"), getJSON("api/queues"), getJSON("health"),
      ]);
      renderOverview(overview);
      renderStorage(health);
      renderQueues(queues.queues);
      if (selected !== null) await refreshDetail();
      status.textContent = "live";
      status.className = "pill ok";
      $("updated").textContent = "updated " + new Date().toLocaleTimeString();
    } catch (error) {
      status.textContent = "unreachable";
      status.className = "pill bad";
      $("updated").textContent = String(error.message || error);
    }
  }

  async function tick() {
    await poll();
    setTimeout(tick, PERIOD_MS);
  }

  // -- the token ------------------------------------------------------------

  function renderToken() {
    $("token-button").textContent = token ? "token ✓" : "token";
    $("token-forget").disabled = !token;
  }

  function showLogin(why) {
    $("login").hidden = false;
    if (why) $("token-why").textContent = why;
    $("token-input").focus();
  }

  $("token-button").addEventListener("click", () => {
    if ($("login").hidden) showLogin(); else $("login").hidden = true;
  });
  $("token-cancel").addEventListener("click", () => { $("login").hidden = true; });
  $("token-forget").addEventListener("click", () => {
    token = "";
    sessionStorage.removeItem(TOKEN_KEY);
    renderToken();
    if (selected !== null) refreshDetail();
  });
  $("token-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const typed = $("token-input").value.trim();
    $("token-input").value = "";
    if (!typed) return;
    token = typed;
    sessionStorage.setItem(TOKEN_KEY, token);
    $("login").hidden = true;
    renderToken();
    if (selected !== null) refreshDetail();
  });

  // -- a queue's detail view ------------------------------------------------

  function text(id, value) {
    $(id).textContent = value === null || value === undefined ? "–" : String(value);
  }

  function fillRows(selector, rows, columns, empty) {
    const body = document.querySelector(selector + " tbody");
    if (!rows.length) {
      const tr = document.createElement("tr");
      const td = cell(empty, "muted");
      td.colSpan = columns;
      tr.append(td);
      body.replaceChildren(tr);
      return;
    }
    body.replaceChildren(...rows);
  }

  function renderDetail(queue) {
    text("detail-name", queue.name);
    text("detail-depth", queue.depth);
    text("detail-in-flight", queue.in_flight);
    text("detail-dead-letter", queue.options.dead_letter);
    text("detail-max-length", queue.options.max_length);
    text("detail-moved", queue.counters.moved);
    const bindings = queue.bindings.map((event) => {
      const li = document.createElement("li");
      li.textContent = event;
      return li;
    });
    if (!bindings.length) {
      const li = document.createElement("li");
      li.className = "muted";
      li.textContent = "none";
      bindings.push(li);
    }
    $("detail-bindings").replaceChildren(...bindings);
    fillRows("#detail-consumers", queue.consumer_list.map((c) => {
      const tr = document.createElement("tr");
      tr.append(cell(c.id, "name"), cell(c.protocol), cell(String(c.connection), "num"),
        cell(String(c.unacked), "num"), cell(String(c.delivered), "num"),
        cell(String(c.acked), "num"));
      return tr;
    }), 6, "no consumers");
    renderMoveTargets();
  }

  function renderMessages(peek) {
    $("peek-note").hidden = peek.depth <= peek.messages.length;
    $("peek-note").textContent = `the oldest ${peek.messages.length} of ${peek.depth}`;
    fillRows("#detail-messages", peek.messages.map((m) => {
      const tr = document.createElement("tr");
      tr.dataset.id = m.id;
      const headers = Object.entries(m.headers).map(([k, v]) => `${k}: ${v}`).join("\n");
      const body = m.body === null ? `(${m.size} bytes, not UTF-8)` : m.body;
      tr.append(cell(m.id, "name"), cell(age(m.age), "num"), cell(String(m.retry), "num"),
        cell(headers, "headers"), cell(body, "body"));
      return tr;
    }), 5, "no ready messages");
  }

  function peekNeedsToken(message) {
    $("peek-note").hidden = false;
    $("peek-note").textContent = "Message bodies need the token or the read token: " + message;
    const body = document.querySelector("#detail-messages tbody");
    const tr = document.createElement("tr");
    const td = document.createElement("td");
    td.colSpan = 5;
    const button = document.createElement("button");
    button.type = "button";
    button.id = "peek-login";
    button.textContent = "Enter the token to see messages";
    button.addEventListener("click", () => showLogin());
    td.append(button);
    tr.append(td);
    body.replaceChildren(tr);
  }

  function renderMoveTargets() {
    const select = $("move-to");
    const targets = queueNames.filter((name) => name !== selected);
    const current = [...select.options].map((o) => o.value);
    if (current.join("\n") !== targets.join("\n")) {
      const keep = select.value;
      select.replaceChildren(...targets.map((name) => {
        const option = document.createElement("option");
        option.value = name;
        option.textContent = name;
        return option;
      }));
      // the common case: a dead-letter queue goes back to the queue it came from
      const preferred = targets.includes(keep) ? keep : deadLetterSources.get(selected);
      if (preferred && targets.includes(preferred)) select.value = preferred;
    }
  }

  async function refreshDetail() {
    const name = selected;
    let queue;
    try {
      queue = await api("GET", queuePath(name));
    } catch (error) {
      if (name === selected) result(`${name}: ${error.message}`, true);
      return;
    }
    if (name !== selected) return;
    renderDetail(queue);
    try {
      renderMessages(await api("GET", queuePath(name, `/messages?limit=${PEEK_LIMIT}`)));
    } catch (error) {
      if (!(error instanceof AuthError)) throw error;
      peekNeedsToken(error.message);
    }
  }

  function openQueue(name) {
    selected = name;
    $("detail").hidden = false;
    $("purge-confirm").hidden = true;
    result("");
    text("detail-name", name);
    refreshDetail();
  }

  function result(message, bad = false) {
    const line = $("action-result");
    line.textContent = message;
    line.className = bad ? "error" : "ok";
  }

  // Run one action; a 401 opens the token form with the reason.
  async function act(run) {
    const name = selected;
    try {
      result(await run(name));
    } catch (error) {
      result(error.message, true);
      if (error instanceof AuthError) {
        showLogin("This action needs the token (--http-token): " + error.message);
      }
    }
    await poll();
  }

  document.querySelector("#queues tbody").addEventListener("click", (event) => {
    const button = event.target.closest("button.open-queue");
    if (button) openQueue(button.dataset.queue);
  });
  $("detail-close").addEventListener("click", () => {
    selected = null;
    $("detail").hidden = true;
  });

  $("publish-form").addEventListener("submit", (event) => {
    event.preventDefault();
    act(async (name) => {
      const raw = $("publish-headers").value.trim();
      let headers;
      try {
        headers = raw ? JSON.parse(raw) : undefined;
      } catch (error) {
        throw new Error("headers are not JSON: " + error.message);
      }
      const body = { body: $("publish-body").value, durable: true };
      if (headers !== undefined) body.headers = headers;
      const sent = await api("POST", queuePath(name, "/messages"), body);
      return `published ${sent.id} to ${sent.queue}`;
    });
  });

  $("move-form").addEventListener("submit", (event) => {
    event.preventDefault();
    act(async (name) => {
      const to = $("move-to").value;
      if (!to) throw new Error("there is no other queue to move to");
      const body = { to, keep_dead_letter_headers: $("move-keep").checked };
      const limit = $("move-limit").value.trim();
      if (limit) body.limit = Number(limit);
      const moved = await api("POST", queuePath(name, "/move"), body);
      const stopped = moved.stopped ? ` (stopped: ${moved.stopped})` : "";
      return `moved ${moved.moved} to ${moved.to}, ${moved.left} left${stopped}`;
    });
  });

  $("purge").addEventListener("click", () => {
    $("purge-yes").textContent = `Yes, purge ${$("detail-depth").textContent} ready messages`;
    $("purge-confirm").hidden = false;
  });
  $("purge-no").addEventListener("click", () => { $("purge-confirm").hidden = true; });
  $("purge-yes").addEventListener("click", () => {
    $("purge-confirm").hidden = true;
    act(async (name) => {
      const purged = await api("POST", queuePath(name, "/purge"));
      return `purged ${purged.purged} messages from ${purged.queue}`;
    });
  });

  renderToken();
  tick();
})();
