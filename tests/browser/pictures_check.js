// Injected by pictures_page.sh after a tpusim page's own script: checks what the page drew and
// sets the body's data-check attribute to ok or to the failures, which the script reads from the
// <body> tag of Chromium's --dump-dom. The page's data is read again from its JSON block.
(() => {
  const failures = [];
  const page = JSON.parse(document.getElementById("data").textContent);
  const kind = document.body.dataset.checkPage;
  // One colour per resource: every element tagged with a resource (bars, timeline ops, roofline
  // dots, legend swatches) shows the same colour for it.
  const colours = {};
  for (const node of document.querySelectorAll("[data-resource]")) {
    const swatch = node.tagName.toLowerCase() === "span" ? node.querySelector("i") : node;
    const colour = swatch.tagName.toLowerCase() === "i" ? getComputedStyle(swatch).backgroundColor
                                                        : getComputedStyle(swatch).fill;
    const resource = node.dataset.resource;
    colours[resource] = colours[resource] || new Set();
    colours[resource].add(colour);
  }
  for (const [resource, set] of Object.entries(colours)) {
    if (set.size !== 1) failures.push("resource " + resource + " has colours " + [...set].join(" "));
  }
  if (kind === "step") {
    // Every lane's drawn ops sum to its busy time over the step, within 1%: the TensorCore's
    // against the breakdown's compute seconds; each lane against its simulated events with each
    // region's repeats (a simulated iteration stands for repeat / simulated ones).
    const drawn = {};
    const rects = {};
    for (const e of page.events) drawn[e[0]] = (drawn[e[0]] || 0) + e[2];
    for (const group of document.querySelectorAll("g.lane")) {
      rects[group.dataset.lane] = group.querySelectorAll("rect.op").length;
    }
    const expected = {};
    for (const [row, region, seconds] of page.check.simulated) {
      const [repeat, simulated, pipelined] = page.check.repeats[region] || [1, 1, false];
      expected[row] = (expected[row] || 0) + seconds * (pipelined ? 1 : repeat / simulated);
    }
    page.lanes.forEach((name, row) => {
      const want = expected[row] || 0;
      const got = drawn[row] || 0;
      if (Math.abs(got - want) > 0.01 * want) {
        failures.push(name + ": drawn " + got + " s, busy " + want + " s");
      }
      if (/^(TensorCore|GPU SMs)/.test(name)) {
        const compute = page.check.compute_seconds;
        if (Math.abs(got - compute) > 0.01 * compute) {
          failures.push(name + ": drawn " + got + " s, breakdown compute " + compute + " s");
        }
      }
      const count = page.events.filter((e) => e[0] === row).length;
      if (rects[name] !== count) failures.push(name + ": " + rects[name] + " of " + count + " drawn");
    });
    for (const id of ["timeline-legend", "breakdown-legend"]) {
      if (document.querySelectorAll("#" + id + " span").length === 0) failures.push("no " + id);
    }
    // The timeline and the breakdown share the colour of MXU-bound compute.
    const bar = document.querySelector('#breakdown [data-resource="mxu"]');
    const op = document.querySelector('#timeline rect.op[data-resource="mxu"]');
    if (!bar || !op || getComputedStyle(bar).fill !== getComputedStyle(op).fill) {
      failures.push("MXU colour differs between breakdown and timeline (or one is missing)");
    }
    // Hover on a compute op shows its FLOPs and bytes.
    op.dispatchEvent(new MouseEvent("mousemove", {bubbles: true, clientX: 10, clientY: 10}));
    const tip = document.getElementById("tip").textContent;
    if (!/FLOPs [0-9.]+ [kMGTP]?FLOP/.test(tip) || !/HBM bytes [0-9.]+ [kMGTP]?B/.test(tip)) {
      failures.push("hover tip lacks FLOPs and bytes: " + tip);
    }
  } else if (kind === "compare") {
    for (const side of ["a", "b"]) {
      const shown = document.querySelector('pre[data-config="' + side + '"]');
      if (!shown || shown.textContent !== page[side].run || !shown.textContent.includes("=")) {
        failures.push("configuration " + side + " not listed");
      }
    }
  } else if (kind === "explore") {
    const xMax = Number(document.getElementById("scatter").dataset.xMax);
    const usable = page.usable_hbm / 2 ** 30;
    if (!(xMax <= 1.2 * usable + 1e-9)) failures.push("x axis ends at " + xMax + " GiB, usable " + usable);
  }
  document.body.dataset.check = failures.length ? failures.join("; ") : "ok";
})();
