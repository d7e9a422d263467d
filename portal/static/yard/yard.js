// Small behaviours the portal's pages share; every page works without them (plain links and forms).
(function () {
  "use strict";
  // The Content-Security-Policy allows no eval: htmx must not evaluate attributes as code.
  if (window.htmx) window.htmx.config.allowEval = false;

  // Countdowns: <span data-countdown="ISO time">…</span> shows the time left, each second.
  function pad(n) { return String(n).padStart(2, "0"); }
  function tick() {
    document.querySelectorAll("[data-countdown]").forEach(function (el) {
      var left = Math.round((Date.parse(el.dataset.countdown) - Date.now()) / 1000);
      if (isNaN(left)) return;
      if (left <= 0) { el.textContent = el.dataset.countdownDone || "any moment now"; return; }
      var h = Math.floor(left / 3600), m = Math.floor((left % 3600) / 60), s = left % 60;
      el.textContent = (h ? h + ":" + pad(m) : m) + ":" + pad(s);
    });
  }
  setInterval(tick, 1000);
  document.addEventListener("DOMContentLoaded", tick);

  // Job page: which node groups are open, sent with each poll so the server draws their GPUs' charts.
  function openGroups() {
    return Array.prototype.map.call(document.querySelectorAll("details.node-group[open]"), function (d) {
      return d.dataset.node;
    }).join(",");
  }
  document.addEventListener("htmx:configRequest", function (event) {
    var target = event.detail.elt;
    if (target && target.id === "live" && document.querySelector("details.node-group")) {
      event.detail.parameters.open = openGroups();
    }
  });
  // A <form data-confirm="question"> asks before it submits (no inline handlers under the CSP).
  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (form.dataset && form.dataset.confirm && !window.confirm(form.dataset.confirm)) event.preventDefault();
  }, true);
  // A <select data-autosubmit> submits its form when changed (no inline handlers under the CSP).
  document.addEventListener("change", function (event) {
    var el = event.target;
    if (el.matches && el.matches("select[data-autosubmit]") && el.form) el.form.submit();
  });
  document.addEventListener("toggle", function (event) {
    var d = event.target;
    if (d.matches && d.matches("details.node-group") && d.open && !d.dataset.drawn && window.htmx) {
      window.htmx.trigger("#live", "refresh");
    }
  }, true);

  // The log follows its end while "Follow" is ticked; otherwise a poll keeps where the reader scrolled to.
  var kept = null;
  function log() { return document.getElementById("log"); }
  function following() { var box = document.getElementById("log-follow"); return !box || box.checked; }
  function toBottom() { var el = log(); if (el && following()) el.scrollTop = el.scrollHeight; }
  document.addEventListener("htmx:beforeSwap", function () { var el = log(); kept = el ? el.scrollTop : null; });
  document.addEventListener("htmx:afterSwap", function () {
    var el = log();
    if (!el) return;
    if (following()) toBottom(); else if (kept !== null) el.scrollTop = kept;
  });
  document.addEventListener("change", function (event) { if (event.target.id === "log-follow") toBottom(); });
  document.addEventListener("DOMContentLoaded", toBottom);
})();

// Content-Security-Policy (portal/settings.py): no eval. htmx would eval `hx-vals='js:…'`; with eval off it
// skips them, and the job page's open node groups are added to its polls here instead.
(function () {
  "use strict";
  // The Content-Security-Policy allows no eval: htmx must not evaluate attributes as code.
  if (window.htmx) window.htmx.config.allowEval = false;
  if (!window.htmx) return;
  window.htmx.config.allowEval = false;
  document.addEventListener("htmx:configRequest", function (event) {
    var elt = event.detail.elt;
    if (elt && elt.id === "live" && document.querySelector("details.node-group") && window.yardOpenGroups) {
      event.detail.parameters.open = window.yardOpenGroups();
    }
  });
})();
