// The approval page: log in, read the queue, approve or reject.
// Every value goes into the DOM as text (textContent), never as HTML. The
// CSRF token lives in memory only; a minted grant token is shown once from
// the approve response and stored nowhere, so a reload does not show it.
"use strict";
(function () {
  let csrf = null;
  const $ = (id) => document.getElementById(id);
  const show = (id, on) => $(id).classList.toggle("hidden", !on);
  const el = (tag, text, cls) => {
    const e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = String(text);
    if (cls) e.className = cls;
    return e;
  };

  async function api(method, path, body) {
    const headers = {};
    if (body !== undefined) headers["Content-Type"] = "application/json";
    if (method !== "GET" && csrf) headers["X-CSRF-Token"] = csrf;
    const r = await fetch(path, {
      method, headers, credentials: "same-origin",
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    let data = null;
    try { data = await r.json(); } catch (_) { data = null; }
    return { status: r.status, data };
  }

  function route() {
    if (location.hash !== "#/autonomous-review") location.hash = "#/autonomous-review";
  }

  async function start() {
    route();
    const s = await api("GET", "/ui/api/session");
    if (s.status === 200) {
      csrf = s.data.csrfToken;
      $("who").textContent = s.data.username;
      show("login", false);
      show("review", true);
      await load();
    } else {
      show("review", false);
      show("login", true);
    }
  }

  function evidence(p) {
    const td = el("td");
    for (const e of p.envelopes || []) {
      const h = e.handoff;
      const line = (e.preMutation ? "pre-mutation " : "cited ") + e.digest.slice(0, 19) + "…";
      td.appendChild(el("div", line));
      if (h) {
        const lines = [h.subject, "completeness: " + h.completeness];
        if (h.frontier) lines.push("missing: " + JSON.stringify(h.frontier));
        for (const u of h.open_unknowns || []) lines.push("unknown: " + u.question + " (probe: " + u.probe + ")");
        if (h.next_transition) lines.push("next: " + h.next_transition.action);
        td.appendChild(el("pre", lines.join("\n")));
      }
    }
    if (!td.childNodes.length) td.textContent = "—";
    return td;
  }

  function row(p) {
    const tr = el("tr");
    tr.dataset.proposal = p.id;
    const a = el("td");
    a.appendChild(el("div", p.id));
    a.appendChild(el("div", p.action + " → " + JSON.stringify(p.target)));
    a.appendChild(el("div", "expects " + JSON.stringify(p.expectedCurrentState)));
    tr.appendChild(a);
    const f = el("td");
    const fi = p.finding || {};
    f.appendChild(el("div", fi.id));
    f.appendChild(el("div", "tier: " + fi.causalProofTier, "tier"));
    f.appendChild(el("div", "blast radius: " + (fi.blastRadiusVerdict || "—"), "verdict"));
    f.appendChild(el("div", "autonomy: " + p.effectiveAutonomy));
    tr.appendChild(f);
    tr.appendChild(evidence(p));
    const st = el("td");
    st.appendChild(el("span", p.status, "badge status"));
    if (p.callbackDelivery && p.callbackDelivery.status === "failed") {
      st.appendChild(el("div", "delivery failed", "badge failed"));
    }
    if (p.callbackHost && p.status === "pending_human_approval") {
      st.appendChild(el("div", "Grant will also be delivered to " + p.callbackHost + " (stored at propose time)"));
    }
    tr.appendChild(st);
    const act = el("td");
    if (p.status === "pending_human_approval") {
      const approve = el("button", "Approve", "approve");
      approve.type = "button";
      const reject = el("button", "Reject", "reject");
      reject.type = "button";
      const confirm = el("div", null, "confirm hidden");
      const url = el("input");
      url.placeholder = "Deliver grant to webhook URL (optional)";
      url.className = "webhook-url";
      const secret = el("input");
      secret.type = "password";
      secret.placeholder = "webhook secret (optional)";
      secret.className = "webhook-secret";
      const go = el("button", "Confirm approval", "confirm-approve");
      go.type = "button";
      confirm.append(url, secret, go);
      approve.onclick = () => confirm.classList.remove("hidden");
      go.onclick = () => decide(p.id, "approve", url.value, secret.value);
      reject.onclick = () => decide(p.id, "reject");
      act.append(approve, reject, confirm);
    } else if (p.status === "grant_issued") {
      const reject = el("button", "Reject", "reject");
      reject.type = "button";
      reject.onclick = () => decide(p.id, "reject");
      act.append(reject);
    }
    tr.appendChild(act);
    return tr;
  }

  async function load() {
    const q = await api("GET", "/ui/api/queue");
    if (q.status !== 200) return start();
    const body = $("queue");
    body.replaceChildren(...q.data.items.map(row));
  }

  async function decide(id, what, url, secret) {
    $("action-error").textContent = "";
    const body = {};
    if (url) body.webhookUrl = url;
    if (url && secret) body.secret = secret;
    const r = await api("POST", "/internal/remediations/" + encodeURIComponent(id) + "/" + what, body);
    if (r.status !== 200) {
      $("action-error").textContent = (r.data && r.data.error && r.data.error.message) || ("HTTP " + r.status);
    } else if (what === "approve" && r.data.grantToken) {
      const d = r.data.grantDelivery;
      $("minted-note").textContent = d && !d.delivered
        ? "Webhook delivery failed after " + d.attempts + " attempts: " + (d.error || "") + ". Copy the token below and hand it to the runner."
        : (d && d.delivered ? "Delivered to " + d.host + "." : "");
      $("minted-proposal").textContent = id;
      $("grant-token").textContent = r.data.grantToken;
      show("minted", true);
    }
    await load();
  }

  $("login-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const r = await api("POST", "/ui/login", { username: $("username").value, password: $("password").value });
    $("password").value = "";
    if (r.status === 200) {
      $("login-error").textContent = "";
      await start();
    } else {
      $("login-error").textContent = "Login refused.";
    }
  });
  $("logout").onclick = async () => { await api("POST", "/ui/logout"); csrf = null; start(); };
  $("refresh").onclick = () => load();
  $("copy-token").onclick = () => {
    const t = $("grant-token").textContent;
    if (navigator.clipboard) navigator.clipboard.writeText(t);
  };
  window.addEventListener("hashchange", route);
  start();
})();
