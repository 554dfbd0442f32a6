/* gpuledger report: draws the charts from the JSON in #report-data as inline SVG.
   No libraries, no network. Sets data-charts-drawn on <body> when done.

   Bars are horizontal: one row per category, its label on the left, never rotated;
   the margins are measured from the labels themselves, so nothing is clipped. Time
   axes tick on whole hours or days (UTC) inside the window. Numbers use one format:
   thousands separators and a fixed number of decimals. */
(function () {
  "use strict";
  var NS = "http://www.w3.org/2000/svg";
  var COLOURS = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948",
                 "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"];
  var W = 900;        // a chart's width: its box's, from MIN_W (it scrolls) to WIDEST
  var WIDEST = 900, MIN_W = 420;
  var MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct",
                "Nov", "Dec"];
  var HOUR = 3600 * 1000;

  function el(name, attrs, parent, text) {
    var node = document.createElementNS(NS, name);
    Object.keys(attrs).forEach(function (k) { node.setAttribute(k, attrs[k]); });
    if (text !== undefined) { node.textContent = text; }
    if (parent) { parent.appendChild(node); }
    return node;
  }

  function fmt(v, decimals) {
    return v.toLocaleString("en-US", {minimumFractionDigits: decimals,
                                      maximumFractionDigits: decimals});
  }

  /* Ticks 0 .. max on a step of 1, 2, 2.5 or 5 × 10^k, about `count` of them. */
  function niceTicks(max, count) {
    if (!(max > 0)) { max = 1; }
    var raw = max / count, p = Math.pow(10, Math.floor(Math.log10(raw)));
    var step = [1, 2, 2.5, 5, 10].map(function (m) { return m * p; })
      .filter(function (s) { return s >= raw; })[0];
    var decimals = Math.max(0, -Math.floor(Math.log10(step) + 1e-9)) +
      (Math.abs(step / p - 2.5) < 1e-9 && step < 10 ? 1 : 0);
    var ticks = [];
    for (var v = 0; v <= max + step * 0.999; v += step) { ticks.push(v); }
    return {ticks: ticks, max: ticks[ticks.length - 1], decimals: decimals};
  }

  /* Width of a text in the class `cls`, measured in the SVG itself. */
  function textWidth(svg, text, cls) {
    var t = el("text", {"class": cls, x: 0, y: 0}, svg, text);
    var w = t.getComputedTextLength();
    svg.removeChild(t);
    return w;
  }

  /* A name as a chart shows it: at most `most` characters (a 500-character team took
     the whole width and left the bars none); the full name goes in its <title>. */
  var LABEL_MOST = 32;
  function shortName(text, most) {
    var chars = Array.from(text);
    return chars.length > most ? chars.slice(0, most - 1).join("") + "\u2026" : text;
  }

  function colour(series, i) { return series.colour || COLOURS[i % COLOURS.length]; }

  function legend(host, series) {
    if (series.length < 2) { return; }
    var box = document.createElement("div");
    box.className = "legend";
    series.forEach(function (s, i) {
      var item = document.createElement("span");
      var swatch = document.createElement("i");
      swatch.style.background = colour(s, i);
      item.appendChild(swatch);
      item.appendChild(document.createTextNode(shortName(s.name, LABEL_MOST)));
      item.title = s.name;
      box.appendChild(item);
    });
    host.appendChild(box);
  }

  /* Keep a text inside the SVG: move it left (or right) if its box sticks out. */
  function keepInside(svg, text) {
    var box = text.getBBox();
    if (box.x + box.width > W - 1) {
      text.setAttribute("x", Number(text.getAttribute("x")) - (box.x + box.width - W + 1));
    }
    if (box.x < 1) {
      text.setAttribute("x", Number(text.getAttribute("x")) + (1 - box.x));
    }
  }

  function bars(host, spec) {
    var cats = spec.categories, series = spec.series;
    var per = spec.stacked ? 1 : series.length;
    var rowH = spec.stacked || per === 1 ? 24 : 8 + 12 * per;
    var svg = el("svg", {width: W, height: 10, role: "img", "class": "chart-svg"}, host);
    el("title", {}, svg, spec.title);
    var most = LABEL_MOST, shown, labelW;
    do {  // labels take at most about 40 % of the width
      shown = cats.map(function (c) { return shortName(c, most); });
      labelW = Math.max.apply(null, shown.map(function (c) {
        return textWidth(svg, c, "label"); }).concat([0]));
      most -= 4;
    } while (labelW > 0.4 * W && most >= 8);
    var M = {top: 8, right: 24, bottom: 40, left: Math.ceil(labelW) + 16};
    var plotW = W - M.left - M.right, plotH = rowH * cats.length;
    var H = M.top + plotH + M.bottom;
    svg.setAttribute("height", H);
    svg.setAttribute("viewBox", "0 0 " + W + " " + H);
    var totals = cats.map(function (_, c) {
      var values = series.map(function (s) { return Math.max(s.values[c] || 0, 0); });
      return spec.stacked ? values.reduce(function (a, b) { return a + b; }, 0)
                          : Math.max.apply(null, values);
    });
    var scale = niceTicks(Math.max.apply(null, totals.concat([0])),
                          Math.max(2, Math.min(6, Math.floor(plotW / 90))));
    function px(v) { return M.left + plotW * v / scale.max; }
    scale.ticks.forEach(function (v) {
      el("line", {x1: px(v), x2: px(v), y1: M.top, y2: M.top + plotH, "class": "grid"}, svg);
      var t = el("text", {x: px(v), y: M.top + plotH + 14, "text-anchor": "middle",
                          "class": "tick"}, svg, fmt(v, scale.decimals));
      keepInside(svg, t);
    });
    el("text", {x: M.left + plotW / 2, y: H - 6, "text-anchor": "middle", "class": "unit"},
       svg, spec.unit);
    cats.forEach(function (cat, c) {
      var y0 = M.top + rowH * c, base = 0;
      var label = el("text", {x: M.left - 8, y: y0 + rowH / 2 + 4, "text-anchor": "end",
                              "class": "label"}, svg, shown[c]);
      if (shown[c] !== cat) { el("title", {}, label, cat); }
      series.forEach(function (s, k) {
        var v = Math.max(s.values[c] || 0, 0);
        var bh = spec.stacked || per === 1 ? rowH - 8 : 10;
        var y = spec.stacked || per === 1 ? y0 + 4 : y0 + 4 + 12 * k;
        var r = el("rect", {x: px(base), y: y, width: Math.max(px(base + v) - px(base), 0),
                            height: bh, fill: colour(s, k), "class": "bar"}, svg);
        // names isolated (U+2068 … U+2069): a right-to-left override read reversed
        el("title", {}, r, "\u2068" + cat + "\u2069 — \u2068" + s.name + "\u2069: " +
           fmt(v, spec.decimals) + " " + spec.unit);
        if (spec.stacked) { base += v; }
      });
    });
    el("line", {x1: M.left, x2: M.left, y1: M.top, y2: M.top + plotH, "class": "axis"}, svg);
    legend(host, series);
  }

  /* Ticks on whole steps of 5 minutes to 60 days (UTC) inside [x0, x1], at most `most`
     of them. */
  function timeTicks(x0, x1, most) {
    // in hours: 5, 10, 15 and 30 minutes first, for data under a few hours
    var steps = [1 / 12, 1 / 6, 1 / 4, 1 / 2, 1, 2, 3, 6, 12, 24, 48, 72, 168, 336, 720, 1440];
    var step = steps[steps.length - 1] * HOUR;
    for (var i = 0; i < steps.length; i++) {
      if ((x1 - x0) / (steps[i] * HOUR) <= most) { step = steps[i] * HOUR; break; }
    }
    var ticks = [];
    for (var t = Math.ceil(x0 / step) * step; t <= x1; t += step) { ticks.push(t); }
    return {ticks: ticks, step: step};
  }

  function dayText(d) { return MONTHS[d.getUTCMonth()] + " " + d.getUTCDate(); }

  function lines(host, spec) {
    var all = [];
    spec.series.forEach(function (s) { s.points.forEach(function (p) { all.push(p); }); });
    var scale = niceTicks(Math.max.apply(null, all.map(function (p) { return p[1]; })
                                                  .concat([0])), W < 600 ? 4 : 5);
    var H = 300;
    var svg = el("svg", {width: W, height: H, viewBox: "0 0 " + W + " " + H, role: "img",
                         "class": "chart-svg"}, host);
    el("title", {}, svg, spec.title);
    var tickW = Math.max.apply(null, scale.ticks.map(function (v) {
      return textWidth(svg, fmt(v, scale.decimals), "tick"); }));
    var M = {top: 12, right: 36, bottom: 58, left: Math.ceil(tickW) + 34};
    var plotW = W - M.left - M.right, plotH = H - M.top - M.bottom;
    var x0 = spec.x0, x1 = spec.x1;
    function px(t) { return M.left + plotW * (t - x0) / (x1 - x0); }
    function py(v) { return M.top + plotH - plotH * v / scale.max; }
    scale.ticks.forEach(function (v) {
      el("line", {x1: M.left, x2: W - M.right, y1: py(v), y2: py(v), "class": "grid"}, svg);
      el("text", {x: M.left - 6, y: py(v) + 4, "text-anchor": "end", "class": "tick"}, svg,
         fmt(v, scale.decimals));
    });
    var unitY = M.top + plotH / 2;
    el("text", {x: 12, y: unitY, "class": "unit", "text-anchor": "middle",
                transform: "rotate(-90 12 " + unitY + ")"}, svg, spec.unit);
    var time = timeTicks(x0, x1, Math.floor(plotW / 80));
    var lastDay = null;
    time.ticks.forEach(function (t) {
      var d = new Date(t), x = px(t);
      el("line", {x1: x, x2: x, y1: M.top, y2: M.top + plotH, "class": "grid"}, svg);
      var day = dayText(d);
      var label = el("text", {x: x, y: M.top + plotH + 16, "text-anchor": "middle",
                              "class": "tick"}, svg);
      if (time.step < 24 * HOUR) {
        el("tspan", {x: x}, label, ("0" + d.getUTCHours()).slice(-2) + ":" +
           ("0" + d.getUTCMinutes()).slice(-2));
        if (day !== lastDay) { el("tspan", {x: x, dy: 13}, label, day); }
      } else {
        el("tspan", {x: x}, label, day);
      }
      lastDay = day;
      keepInside(svg, label);
    });
    el("text", {x: M.left + plotW / 2, y: H - 6, "text-anchor": "middle", "class": "unit"},
       svg, "time (UTC)");
    el("line", {x1: M.left, x2: W - M.right, y1: M.top + plotH, y2: M.top + plotH,
                "class": "axis"}, svg);
    spec.series.forEach(function (s, k) {
      var c = colour(s, k);
      var d = s.points.map(function (p, j) {
        return (j ? "L" : "M") + px(p[0]).toFixed(1) + " " + py(p[1]).toFixed(1);
      }).join(" ");
      var path = el("path", {d: d, fill: "none", stroke: c, "stroke-width": 2,
                             "class": "series"}, svg);
      el("title", {}, path, s.name);
      s.points.forEach(function (p) {
        var dot = el("circle", {cx: px(p[0]), cy: py(p[1]), r: 2.5, fill: c}, svg);
        var size = spec.bucket_minutes * HOUR / 60;
        var from = new Date(Math.floor(p[0] / size) * size).toISOString();
        var at = spec.bucket_minutes >= 1440 ? "day " + from.slice(0, 10) :
          (spec.bucket_minutes === 60 ? "hour" : spec.bucket_minutes + " minutes") +
          " from " + from.slice(0, 16).replace("T", " ") + " UTC";
        el("title", {}, dot, s.name + ", " + at + ": " + fmt(p[1], spec.decimals) + " " +
           spec.unit);
      });
    });
    legend(host, spec.series);
  }

  var payload = JSON.parse(document.getElementById("report-data").textContent);
  var drawn = 0;
  payload.charts.forEach(function (spec) {
    var host = document.getElementById(spec.id);
    // drawn at the width it has, so that its text keeps its size (a 900-wide drawing
    // shrunk to 370 px had 4-px ticks and empty bands above and below)
    W = Math.max(MIN_W, Math.min(WIDEST, Math.floor(host.clientWidth || WIDEST)));
    if (spec.kind === "line") { lines(host, spec); } else { bars(host, spec); }
    drawn += 1;
  });
  document.body.setAttribute("data-charts-drawn", String(drawn));
})();
