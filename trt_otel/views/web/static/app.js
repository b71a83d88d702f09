// The live page of one build. It follows /events (Server-Sent Events; the browser resumes a
// dropped stream with Last-Event-ID, and the page ignores anything it has already seen) and
// reads the shared read model, /status, for the phase tree and the estimates, so it folds
// phases exactly as the terminal and /status do. Every string that comes from the build is
// put in the page as text (textContent), never as markup.
"use strict";

(function () {
  const SILENT_AFTER_S = 5; // TensorRT's ordinary pauses between callbacks are shorter
  const STATUS_EVERY_MS = 500; // at most this often: /status takes the build's read-model lock
  const GPU_SAMPLES_KEPT = 600;
  const TIMELINE_EVERY_MS = 2000; // the server redraws it at most once a second
  const TOKEN_KEY = "trt-otel-cancel-token";
  const CALLBACKS = ["phase_start", "step", "phase_finish"];
  const EVENT_TYPES = CALLBACKS.concat(["build_start", "cancel", "anomaly", "log", "build_end", "gpu", "process"]);
  const BASIS = {
    history: "from earlier builds of this model",
    progress: "from the overall progress so far (rough)",
    steps: "from this phase's time per step",
    finished: "finished",
  };
  const OUTCOME_WORDS = {
    success: "Built successfully",
    failure: "The build failed",
    cancellation: "The build was cancelled",
    timeout: "The build timed out",
  };

  const view = {
    lastSeq: -1,
    events: 0,
    startMonoNs: null,
    lastCallbackMonoNs: null,
    clock: null, // the build's monotonic clock: {monoNs, at} where at is performance.now()
    cancel: null,
    end: null,
    status: null,
    gpu: [],
    source: null,
    statusTimer: null,
    statusBusy: false,
    statusAgain: false,
    lastStatusAt: 0,
    closed: false,
  };

  function $(id) {
    return document.getElementById(id);
  }

  function text(id, value) {
    const node = $(id);
    if (node.textContent !== value) node.textContent = value;
  }

  function show(id, visible) {
    $(id).hidden = !visible;
  }

  function formatDuration(seconds) {
    if (seconds < 60) return seconds.toFixed(1) + "s";
    const whole = Math.floor(seconds);
    const minutes = Math.floor(whole / 60);
    if (minutes < 60) return minutes + "m" + String(whole % 60).padStart(2, "0") + "s";
    return Math.floor(minutes / 60) + "h" + String(minutes % 60).padStart(2, "0") + "m";
  }

  function percent(ratio) {
    return Math.round(Math.max(0, Math.min(1, ratio)) * 100) + "%";
  }

  function buildNowNs() {
    if (view.clock === null) return null;
    return view.clock.monoNs + (performance.now() - view.clock.at) * 1e6;
  }

  // -- the event stream ---------------------------------------------------------------------

  function connect() {
    const source = new EventSource("events");
    view.source = source;
    source.onopen = function () {
      text("link", "live");
    };
    source.onerror = function () {
      if (view.closed) return;
      // EventSource reconnects by itself, sending the last id it saw.
      text("link", source.readyState === EventSource.CLOSED ? "connection lost" : "reconnecting…");
    };
    for (const type of EVENT_TYPES) {
      source.addEventListener(type, onEvent);
    }
    source.addEventListener("gap", function () {
      text("link", "live (some early events were no longer held by the build)");
    });
  }

  function onEvent(message) {
    const seq = Number(message.lastEventId);
    if (!(seq > view.lastSeq)) return; // seen before: a replay after a reconnect
    view.lastSeq = seq;
    view.events += 1;
    let event;
    try {
      event = JSON.parse(message.data);
    } catch (error) {
      return;
    }
    const type = event.type;
    if (CALLBACKS.indexOf(type) >= 0) {
      view.lastCallbackMonoNs = event.mono_ns;
    } else if (type === "build_start") {
      view.startMonoNs = event.mono_ns;
      text("build-id", event.build_id || "");
      const attributes = event.attributes || {};
      const model = attributes["model.path"] || "";
      const backend = attributes["trt.backend"] || "";
      text("model", [model, backend].filter(Boolean).join(" · "));
    } else if (type === "cancel") {
      if (view.cancel === null) view.cancel = event;
    } else if (type === "gpu") {
      addGpuSample(event);
    } else if (type === "build_end") {
      view.end = event;
    }
    text("events-count", String(view.events));
    if (view.end !== null) {
      finish();
    } else {
      requestStatus();
    }
  }

  // The timeline is drawn by the server, by the same code as `trt-otel report`: an image,
  // fetched again every few seconds while the build runs, and once more at its end.
  function refreshTimeline() {
    $("timeline").src = "timeline.svg?at=" + Date.now();
  }
  const timelineTimer = setInterval(function () {
    if (view.closed) {
      clearInterval(timelineTimer);
    } else {
      refreshTimeline();
    }
  }, TIMELINE_EVERY_MS);

  function finish() {
    // One last read of the tree while the build's process still serves it, then let go of
    // the stream (the build waits for its streaming clients before it exits).
    renderEnd();
    refreshTimeline();
    fetchStatus().then(function () {
      view.closed = true;
      if (view.source !== null) view.source.close();
      text("link", "the build has ended");
    });
  }

  // -- /status ------------------------------------------------------------------------------

  function requestStatus() {
    if (view.closed) return;
    if (view.statusBusy) {
      view.statusAgain = true;
      return;
    }
    const wait = view.lastStatusAt + STATUS_EVERY_MS - performance.now();
    if (wait <= 0) {
      fetchStatus();
    } else if (view.statusTimer === null) {
      view.statusTimer = setTimeout(function () {
        view.statusTimer = null;
        if (!view.closed) fetchStatus();
      }, wait);
    }
  }

  function fetchStatus() {
    view.statusBusy = true;
    const asked = performance.now();
    return fetch("status", { cache: "no-store" })
      .then(function (response) {
        if (!response.ok) throw new Error("status " + response.status);
        return response.json();
      })
      .then(function (status) {
        const answered = performance.now();
        if (status.elapsed_s !== null && view.startMonoNs !== null && status.outcome === null) {
          view.clock = { monoNs: view.startMonoNs + status.elapsed_s * 1e9, at: (asked + answered) / 2 };
        }
        view.status = status;
        render();
      })
      .catch(function () {
        // The build's process may have exited right after its end: the stream said how it
        // ended, and phases still open then were closed by that end, as the fold does.
        if (view.end !== null && view.status !== null && view.status.outcome === null) {
          renderTree(closeOpen(view.status.phases || [], "build ended: " + view.end.outcome));
        }
      })
      .then(function () {
        view.statusBusy = false;
        view.lastStatusAt = performance.now();
        if (view.statusAgain && !view.closed) {
          view.statusAgain = false;
          requestStatus();
        }
      });
  }

  // -- drawing ------------------------------------------------------------------------------

  function render() {
    const status = view.status;
    if (status === null) return;
    const state = view.end !== null ? "finished" : status.status;
    const label = view.end !== null ? view.end.outcome : status.status;
    const badge = $("state");
    badge.dataset.state = view.end !== null ? view.end.outcome : state;
    text("state", label);
    const progress = status.progress || 0;
    $("progress").value = progress;
    text("progress-text", percent(progress));
    text("steps", Number(status.steps_completed).toLocaleString("en"));
    text("eta", etaText(status.eta, status.outcome !== null));
    renderCancel(status.cancel || (view.cancel && { reason: view.cancel.reason, source: view.cancel.source, policy: view.cancel.policy }));
    renderTree(status.phases || []);
    renderBuilder(status.builder);
    if (status.outcome !== null && view.end === null) {
      view.end = { outcome: status.outcome, detail: status.detail || "", error_type: status.error_type };
      renderEnd();
    }
    tick();
  }

  // The builder's process as /status folds its samples (a `process` event on the stream asks
  // for a fresh read): working, idle, stopped or gone, with the evidence for it.
  function builderText(builder) {
    let words = builder.state;
    if (builder.state === "idle" && typeof builder.since_s === "number") {
      words += " for " + formatDuration(builder.since_s);
    }
    if (builder.evidence) words += " (" + builder.evidence + ")";
    return words;
  }

  function builderDetails(builder) {
    const parts = [];
    if (builder.pid !== null && builder.pid !== undefined) parts.push("process " + builder.pid);
    if (builder.status) parts.push(builder.status);
    if (typeof builder.threads === "number") parts.push(builder.threads + " threads");
    if (typeof builder.busiest_thread_percent === "number") {
      parts.push("busiest thread " + Math.round(builder.busiest_thread_percent) + "%");
    }
    if (typeof builder.cpu_seconds === "number") parts.push(builder.cpu_seconds.toFixed(1) + " s of CPU");
    if (typeof builder.peak_rss_bytes === "number") {
      parts.push("peak " + Math.round(builder.peak_rss_bytes / 2 ** 20) + " MiB");
    }
    return parts.join(" · ");
  }

  function renderBuilder(builder) {
    if (!builder || !builder.state) {
      show("builder", false);
      return;
    }
    const verdict = $("builder-verdict");
    if (verdict.dataset.state !== builder.state) verdict.dataset.state = builder.state;
    text("builder-verdict", builderText(builder));
    const details = builderDetails(builder);
    if (verdict.title !== details) verdict.title = details;
    show("builder", true);
  }

  function etaText(eta, ended) {
    if (ended) return "none (ended)";
    if (!eta) return "–";
    const basis = BASIS[eta.basis] || eta.basis;
    if (eta.seconds === null) return "unknown: " + (eta.unknown || basis);
    if (eta.basis === "finished") return "done";
    return "about " + formatDuration(eta.seconds) + ", " + basis;
  }

  function renderCancel(cancel) {
    if (!cancel) return;
    show("cancelled", true);
    text("cancel-reason", cancel.reason || "(none given)");
    text("cancel-source", cancel.source || "");
    show("cancel-policy-row", Boolean(cancel.policy));
    text("cancel-policy", cancel.policy || "");
  }

  function renderEnd() {
    const end = view.end;
    if (end === null) return;
    show("end", true);
    const outcome = $("outcome");
    outcome.dataset.outcome = end.outcome;
    text("outcome", (OUTCOME_WORDS[end.outcome] || end.outcome) + " (" + end.outcome + ")");
    const detail = [end.detail, end.error_type].filter(Boolean).join(" · ");
    text("outcome-detail", detail);
    text("state", end.outcome);
    $("state").dataset.state = end.outcome;
    $("cancel-button").disabled = true;
    show("silence", false);
    if (end.outcome === "success") {
      $("progress").value = 1;
      text("progress-text", "100%");
    }
    if (view.cancel !== null) renderCancel(view.cancel);
  }

  function phaseItem(phase) {
    const item = document.createElement("li");
    item.className = "phase " + (phase.status || "");
    const line = document.createElement("span");
    line.className = "line";
    const mark = document.createElement("span");
    mark.className = "mark";
    mark.setAttribute("aria-hidden", "true");
    mark.textContent = phase.status === "open" ? "▶" : phase.status === "aborted" ? "✗" : "✓";
    const state = document.createElement("span");
    state.className = "visually-hidden";
    state.textContent = phase.status + ": ";
    const name = document.createElement("span");
    name.className = "name";
    name.textContent = phase.name;
    line.append(mark, state, name);
    const facts = document.createElement("span");
    facts.className = "facts-inline";
    if (phase.count !== undefined) {
      // A folded group; a group of one is just a finished phase.
      facts.textContent = phase.count === 1
        ? " · " + formatDuration(phase.elapsed_s)
        : " ×" + phase.count + " · " + formatDuration(phase.elapsed_s) + " in all";
    } else {
      const steps = " " + (phase.last_step + 1) + "/" + phase.num_steps;
      facts.textContent = steps + " · " + formatDuration(phase.elapsed_s);
      if (phase.status === "open") {
        const bar = document.createElement("progress");
        bar.max = 1;
        bar.value = phase.progress || 0;
        bar.setAttribute("aria-label", phase.name + " progress");
        line.append(" ", bar);
      }
      if (phase.close_reason) facts.textContent += " (" + phase.close_reason + ")";
      if (phase.children_hidden) {
        facts.textContent += " · " + phase.children_hidden + " more nested below, not shown";
      }
    }
    line.append(facts);
    item.append(line);
    const children = phase.children || [];
    if (children.length) {
      const list = document.createElement("ul");
      for (const child of children) list.append(phaseItem(child));
      item.append(list);
    }
    return item;
  }

  function renderTree(phases) {
    const tree = $("tree");
    const items = phases.map(phaseItem);
    tree.replaceChildren.apply(tree, items);
    show("tree-empty", phases.length === 0);
  }

  function closeOpen(phases, reason) {
    return phases.map(function (phase) {
      const closed = Object.assign({}, phase, { children: closeOpen(phase.children || [], reason) });
      if (phase.status === "open") {
        closed.status = "aborted";
        closed.close_reason = reason;
      }
      return closed;
    });
  }

  function innermostOpen(phases) {
    let found = null;
    for (const phase of phases) {
      if (phase.status !== "open") continue;
      found = innermostOpen(phase.children || []) || phase;
    }
    return found;
  }

  // Elapsed, last callback and the silent-step notice move between reads of /status.
  function tick() {
    const status = view.status;
    const now = buildNowNs();
    if (view.end === null && now !== null && view.startMonoNs !== null) {
      text("elapsed", formatDuration(Math.max(0, now - view.startMonoNs) / 1e9));
    } else if (status !== null && status.elapsed_s !== null) {
      text("elapsed", formatDuration(status.elapsed_s));
    }
    if (view.end !== null || now === null || view.lastCallbackMonoNs === null) {
      if (view.end !== null) text("last-callback", "–");
      show("silence", false);
      return;
    }
    const quiet = Math.max(0, now - view.lastCallbackMonoNs) / 1e9;
    text("last-callback", formatDuration(quiet) + " ago");
    const silent = quiet >= SILENT_AFTER_S;
    if (silent) {
      const phase = status !== null ? innermostOpen(status.phases || []) : null;
      let where = "";
      if (phase !== null) {
        const step = Math.min(phase.last_step + 2, phase.num_steps);
        where = " It is inside step " + step + " of " + phase.num_steps + " of “" + phase.name + "”.";
      }
      const waiting = status !== null && status.status === "cancelling" ? " The cancel waits for that step to end." : "";
      text("silence-text", "Silent step: no callback from TensorRT for " + formatDuration(quiet) + "." + where + waiting);
    }
    show("silence", silent);
  }

  // -- GPU ----------------------------------------------------------------------------------

  function addGpuSample(event) {
    view.gpu.push(event);
    if (view.gpu.length > GPU_SAMPLES_KEPT) view.gpu.shift();
    show("gpu", true);
    const parts = ["GPU " + event.index];
    if (event.utilization !== null && event.utilization !== undefined) parts.push(percent(event.utilization) + " busy");
    if (event.memory_used_bytes !== null && event.memory_used_bytes !== undefined) {
      let memory = (event.memory_used_bytes / 2 ** 30).toFixed(1);
      if (event.memory_total_bytes) memory += " of " + (event.memory_total_bytes / 2 ** 30).toFixed(0);
      parts.push(memory + " GiB used");
    }
    text("gpu-now", parts.join(" · "));
    drawGpu();
  }

  function line(values) {
    const n = values.length;
    const points = [];
    values.forEach(function (value, i) {
      if (value === null || value === undefined || Number.isNaN(value)) return;
      const x = n > 1 ? (i / (n - 1)) * 300 : 300;
      points.push(x.toFixed(1) + "," + (100 - Math.max(0, Math.min(1, value)) * 100).toFixed(1));
    });
    return points.join(" ");
  }

  function drawGpu() {
    const samples = view.gpu;
    $("gpu-util-line").setAttribute("points", line(samples.map(function (s) { return s.utilization; })));
    $("gpu-mem-line").setAttribute("points", line(samples.map(function (s) {
      return s.memory_total_bytes ? s.memory_used_bytes / s.memory_total_bytes : null;
    })));
  }

  // -- cancel -------------------------------------------------------------------------------

  const ANSWERS = {
    200: "Already cancelling (200): the build stops at TensorRT's next step.",
    202: "Cancel accepted (202): the build stops at TensorRT's next step, or is stopped from outside after its grace period.",
    400: "The build did not understand the request (400).",
    401: "A token is needed (401): paste the build's cancel token.",
    403: "Wrong token (403).",
    409: "The build has already ended (409).",
  };

  function onCancel(submitted) {
    submitted.preventDefault();
    const token = $("token").value.trim();
    const reason = $("reason").value.trim();
    const headers = { "Content-Type": "application/json" };
    if (token) headers.Authorization = "Bearer " + token;
    text("cancel-result", "Asking the build to stop…");
    fetch("cancel", { method: "POST", headers: headers, body: JSON.stringify({ reason: reason }) })
      .then(function (response) {
        if (response.status === 200 || response.status === 202) {
          try {
            sessionStorage.setItem(TOKEN_KEY, token);
          } catch (error) {
            /* storage may be off; the field keeps it anyway */
          }
        }
        const known = ANSWERS[response.status];
        return response.text().then(function (body) {
          let said = "";
          try {
            said = JSON.parse(body).error || "";
          } catch (error) {
            said = "";
          }
          text("cancel-result", known || "The build answered " + response.status + (said ? ": " + said : "."));
          $("cancel-result").dataset.status = String(response.status);
          requestStatus();
        });
      })
      .catch(function () {
        text("cancel-result", "Could not reach the build (has its process exited?).");
        $("cancel-result").dataset.status = "unreachable";
      });
  }

  function start() {
    try {
      $("token").value = sessionStorage.getItem(TOKEN_KEY) || "";
    } catch (error) {
      /* storage may be off */
    }
    $("cancel-form").addEventListener("submit", onCancel);
    connect();
    requestStatus();
    setInterval(function () {
      tick();
      // Estimates and elapsed times move even when TensorRT says nothing.
      if (view.end === null && performance.now() - view.lastStatusAt > 2000) requestStatus();
    }, 1000);
  }

  start();
})();
