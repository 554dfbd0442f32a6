/* gpuledger report: draws the charts from the JSON in #report-data as inline SVG.
   No libraries, no network. Sets data-charts-drawn on <body> when done. */
(function () {
  "use strict";
  var NS = "http://www.w3.org/2000/svg";
  var COLOURS = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948",
                 "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"];
  var W = 760, H = 300, M = {top: 16, right: 16, bottom: 70, left: 64};

  function el(name, attrs, parent, text) {
    var node = document.createElementNS(NS, name);
    Object.keys(attrs).forEach(function (k) { node.setAttribute(k, attrs[k]); });
    if (text !== undefined) { node.textContent = text; }
    if (parent) { parent.appendChild(node); }
    return node;
  }

  function niceMax(v) {
    if (!(v > 0)) { return 1; }
    var p = Math.pow(10, Math.floor(Math.log10(v)));
    var steps = [1, 2, 2.5, 5, 10];
    for (var i = 0; i < steps.length; i++) { if (steps[i] * p >= v) { return steps[i] * p; } }
    return 10 * p;
  }

  function fmt(v) {
    if (Math.abs(v) >= 1000) { return Math.round(v).toLocaleString("en"); }
    return String(Math.round(v * 100) / 100);
  }

  function frame(host, spec, yMax) {
    var svg = el("svg", {viewBox: "0 0 " + W + " " + H, width: W, height: H,
                         role: "img", "class": "chart-svg"}, host);
    el("title", {}, svg, spec.title);
    var plotH = H - M.top - M.bottom;
    for (var i = 0; i <= 4; i++) {
      var v = yMax * i / 4, y = M.top + plotH - plotH * i / 4;
      el("line", {x1: M.left, x2: W - M.right, y1: y, y2: y, "class": "grid"}, svg);
      el("text", {x: M.left - 6, y: y + 4, "text-anchor": "end", "class": "tick"}, svg, fmt(v));
    }
    el("text", {x: 12, y: M.top + plotH / 2, "class": "unit",
                transform: "rotate(-90 12 " + (M.top + plotH / 2) + ")",
                "text-anchor": "middle"}, svg, spec.unit);
    return svg;
  }

  function legend(host, names) {
    var box = document.createElement("div");
    box.className = "legend";
    names.forEach(function (name, i) {
      var item = document.createElement("span");
      var swatch = document.createElement("i");
      swatch.style.background = COLOURS[i % COLOURS.length];
      item.appendChild(swatch);
      item.appendChild(document.createTextNode(name));
      box.appendChild(item);
    });
    host.appendChild(box);
  }

  function bars(host, spec) {
    var cats = spec.categories, series = spec.series;
    var totals = cats.map(function (_, c) {
      return spec.stacked
        ? series.reduce(function (s, ser) { return s + Math.max(ser.values[c] || 0, 0); }, 0)
        : Math.max.apply(null, series.map(function (ser) { return ser.values[c] || 0; }));
    });
    var yMax = niceMax(Math.max.apply(null, totals.concat([0])));
    var svg = frame(host, spec, yMax);
    var plotW = W - M.left - M.right, plotH = H - M.top - M.bottom;
    var band = plotW / Math.max(cats.length, 1);
    var per = spec.stacked ? 1 : series.length;
    var bw = Math.max(band * 0.8 / per, 1);
    cats.forEach(function (cat, c) {
      var x0 = M.left + band * c + band * 0.1, base = 0;
      series.forEach(function (ser, s) {
        var v = Math.max(ser.values[c] || 0, 0), h = plotH * v / yMax;
        var x = spec.stacked ? x0 : x0 + s * bw;
        var y = M.top + plotH - h - (spec.stacked ? plotH * base / yMax : 0);
        var r = el("rect", {x: x, y: y, width: spec.stacked ? band * 0.8 : bw, height: h,
                            fill: COLOURS[s % COLOURS.length], "class": "bar"}, svg);
        el("title", {}, r, cat + " — " + ser.name + ": " + fmt(v) + " " + spec.unit);
        if (spec.stacked) { base += v; }
      });
      var lx = M.left + band * c + band / 2, ly = M.top + plotH + 12;
      el("text", {x: lx, y: ly, "class": "tick", "text-anchor": "end",
                  transform: "rotate(-35 " + lx + " " + ly + ")"}, svg, cat);
    });
    legend(host, series.map(function (s) { return s.name; }));
  }

  function lines(host, spec) {
    var all = [];
    spec.series.forEach(function (s) { s.points.forEach(function (p) { all.push(p); }); });
    var t0 = Math.min.apply(null, all.map(function (p) { return p[0]; }));
    var t1 = Math.max.apply(null, all.map(function (p) { return p[0]; }));
    if (t1 === t0) { t1 = t0 + 1; }
    var yMax = niceMax(Math.max.apply(null, all.map(function (p) { return p[1]; }).concat([0])));
    var svg = frame(host, spec, yMax);
    var plotW = W - M.left - M.right, plotH = H - M.top - M.bottom;
    function px(t) { return M.left + plotW * (t - t0) / (t1 - t0); }
    function py(v) { return M.top + plotH - plotH * v / yMax; }
    for (var i = 0; i <= 4; i++) {
      var t = t0 + (t1 - t0) * i / 4;
      el("text", {x: px(t), y: M.top + plotH + 16, "text-anchor": "middle", "class": "tick"},
         svg, new Date(t).toISOString().slice(5, 16).replace("T", " "));
    }
    spec.series.forEach(function (s, k) {
      var colour = COLOURS[k % COLOURS.length];
      var d = s.points.map(function (p, j) {
        return (j ? "L" : "M") + px(p[0]).toFixed(1) + " " + py(p[1]).toFixed(1);
      }).join(" ");
      var path = el("path", {d: d, fill: "none", stroke: colour, "stroke-width": 2,
                             "class": "series"}, svg);
      el("title", {}, path, s.name);
      s.points.forEach(function (p) {
        var dot = el("circle", {cx: px(p[0]), cy: py(p[1]), r: 2.5, fill: colour}, svg);
        el("title", {}, dot, s.name + " " + new Date(p[0]).toISOString().slice(0, 16) +
           ": " + fmt(p[1]) + " " + spec.unit);
      });
    });
    legend(host, spec.series.map(function (s) { return s.name; }));
  }

  var payload = JSON.parse(document.getElementById("report-data").textContent);
  var drawn = 0;
  payload.charts.forEach(function (spec) {
    var host = document.getElementById(spec.id);
    if (spec.kind === "line") { lines(host, spec); } else { bars(host, spec); }
    drawn += 1;
  });
  document.body.setAttribute("data-charts-drawn", String(drawn));
})();
