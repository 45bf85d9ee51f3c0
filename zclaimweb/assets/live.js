// The console's live counts: every data-refresh ms, api/stats gives each
// schedule's counts, which replace the text of the elements whose
// data-live names them ("0.scheduled"). Text only: nothing is parsed as HTML.
(function () {
  var body = document.body;
  var every = parseInt(body.getAttribute("data-refresh"), 10) || 2000;
  var url = body.getAttribute("data-stats");
  var live = document.querySelectorAll("[data-live]");
  if (!live.length || !url) return;
  function tick() {
    fetch(url, {credentials: "same-origin", cache: "no-store"})
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (s) {
        if (!s) return;
        live.forEach(function (el) {
          var p = el.getAttribute("data-live").split(".");
          var c = s.schedules[parseInt(p[0], 10)];
          if (!c || !(p[1] in c)) return;
          var v = c[p[1]];
          if (v === "") v = {oldest_due: "none due", next: "–", state_lost: "never"}[p[1]] || "";
          el.textContent = String(v);
        });
        body.setAttribute("data-updated", String(Date.now()));
      })
      .catch(function () {})
      .then(function () { setTimeout(tick, every); });
  }
  setTimeout(tick, every);
})();
