// mqserver dashboard: polls the JSON API once a second and redraws.
// Plain DOM code with no build step; text goes in through textContent only,
// so queue names and error messages can never inject markup.
"use strict";

(() => {
  const PERIOD_MS = 1000;
  const HISTORY = 60; // points per sparkline: one minute
  const SVG = "http://www.w3.org/2000/svg";
  const queueHistory = new Map(); // queue name -> {depth, publish, deliver}
  const totals = { publish: [], deliver: [] };

  const $ = (id) => document.getElementById(id);

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

  async function getJSON(path) {
    const response = await fetch(path, { cache: "no-store" });
    if (!response.ok && response.status !== 503) {
      throw new Error(`${path}: HTTP ${response.status}`);
    }
    return response.json();
  }

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
      tr.append(
        cell(queue.name, "name"),
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
    document.querySelector("#queues tbody").replaceChildren(...rows);
    $("queue-count").textContent = `(${queues.length})`;
    $("no-queues").hidden = queues.length > 0;
  }

  async function tick() {
    const status = $("status");
    try {
      const [overview, queues, health] = await Promise.all([
        getJSON("api/overview"), getJSON("api/queues"), getJSON("health"),
      ]);
      renderOverview(overview);
      renderStorage(health);
      renderQueues(queues.queues);
      status.textContent = "live";
      status.className = "pill ok";
      $("updated").textContent = "updated " + new Date().toLocaleTimeString();
    } catch (error) {
      status.textContent = "unreachable";
      status.className = "pill bad";
      $("updated").textContent = String(error.message || error);
    } finally {
      setTimeout(tick, PERIOD_MS);
    }
  }

  tick();
})();
