"""The script of the published history's pages and of the HTML report (one file in the
site, ``accelperf.js``; inline in the report): it expands a page's data, draws its plots
with vega-embed (SVG), and applies the machine and branch filters.

A page says what it is by the elements it holds: ``#accelperf-data`` (a case of the
history: columns, expanded to rows here), ``#accelperf-specs`` (the plots' Vega-Lite
specifications, :mod:`pytest_accelperf.report.charts`; each drawn into the element whose
``data-spec`` is its index; ``#accelperf-specs-gz`` in the report, gzipped),
``#accelperf-vega-gz`` (the report: the plotting library gzipped, unpacked by the
browser's DecompressionStream and run before anything is drawn),
``#accelperf-index`` (the index: the filters hide rows). When every plot is drawn,
``<html data-accelperf="drawn">``; ``window.accelperf.views`` holds the Vega views and
``window.accelperf.errors`` what failed.
"""

PAGE_JS = r"""
(function () {
  "use strict";
  var A = window.accelperf = window.accelperf || {views: [], errors: []};
  var ALL = "*";

  function decode(col) {  // a column: a list, or {"r": [[value, count], ...]}
    if (Array.isArray(col)) return col;
    var out = [];
    col.r.forEach(function (run) { for (var k = 0; k < run[1]; k++) out.push(run[0]); });
    return out;
  }

  function expand(data) {
    var cols = {}, name;
    for (name in data.cols) cols[name] = decode(data.cols[name]);
    for (name in data.dict) {
      var table = data.dict[name];
      cols[name] = cols[name].map(function (k) { return k === null ? null : table[k]; });
    }
    var rows = [];
    for (var k = 0; k < data.n; k++) {
      var row = {};
      for (name in cols) row[name] = cols[name][k];
      rows.push(row);
    }
    var memory = [];
    Object.keys(data.devices || {}).forEach(function (device) {
      decode(data.devices[device]).forEach(function (mib, k) {
        if (mib === null) return;
        var r = rows[k];
        memory.push({i: r.i, device: device, mib: mib, commit: r.commit, time: r.time,
                     machine: r.machine, branch: r.branch});
      });
    });
    return {sessions: rows, memory: memory, marks: data.marks || []};
  }

  function json(id) {
    var el = document.getElementById(id);
    return el ? JSON.parse(el.textContent) : null;
  }

  async function unpack(el) {  // gzipped, base64-encoded text
    var bytes = Uint8Array.from(atob(el.textContent.trim()), function (c) {
      return c.charCodeAt(0);
    });
    var stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
    return await new Response(stream).text();
  }

  async function loadVega() {
    if (window.vegaEmbed) return;
    var packed = document.getElementById("accelperf-vega-gz");
    if (!packed) throw new Error("the plotting library (vega.js) did not load");
    var text = await unpack(packed);
    var script = document.createElement("script");
    script.textContent = text;
    document.head.appendChild(script);
  }

  async function drawAll() {
    var packedSpecs = document.getElementById("accelperf-specs-gz");
    var specs = packedSpecs ? JSON.parse(await unpack(packedSpecs))
                            : json("accelperf-specs") || [];
    var data = json("accelperf-data");
    var datasets = data ? expand(data) : null;
    await loadVega();
    var els = document.querySelectorAll("[data-spec]");
    for (var k = 0; k < els.length; k++) {
      var el = els[k], spec = specs[+el.dataset.spec];
      if (datasets) spec.datasets = datasets;
      try {
        var result = await window.vegaEmbed(el, spec, {renderer: "svg", actions: false,
                                                       mode: "vega-lite"});
        A.views.push(result.view);
      } catch (err) {
        A.errors.push(String(err));
        console.error("accelperf: plot " + el.dataset.spec + ": " + err);
      }
    }
  }

  function filterValue(id) {
    var el = document.getElementById(id);
    return el ? el.value : ALL;
  }

  async function applyFilters() {
    var machine = filterValue("f-machine"), branch = filterValue("f-branch");
    if (!document.getElementById("f-machine")) return;  // the report: no filters
    await Promise.all(A.views.map(function (view) {
      return view.signal("machine", machine).signal("branch", branch).runAsync();
    }));
    document.querySelectorAll("tr[data-machine]").forEach(function (tr) {
      var branches = (tr.dataset.branches || "").split(" ");
      var show = (machine === ALL || tr.dataset.machine === machine) &&
                 (branch === ALL || branches.indexOf(branch) >= 0);
      tr.style.display = show ? "" : "none";
    });
  }

  A.applyFilters = applyFilters;

  async function main() {
    ["f-machine", "f-branch"].forEach(function (id) {
      var el = document.getElementById(id);
      if (el) el.addEventListener("change", applyFilters);
    });
    try {
      await drawAll();
      await applyFilters();
    } catch (err) {
      A.errors.push(String(err));
      console.error("accelperf: " + err);
    }
    document.documentElement.dataset.accelperf = "drawn";
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", main);
  else main();
})();
"""
