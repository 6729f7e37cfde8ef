/* The explorers on the book's pages (attnopt.page_explorer): every state was drawn and its numbers
   computed by attnopt when the notebook ran; this script only shows the one the controls select.
   Moving a control swaps the figure, its alt text and the line of numbers (an aria-live output).
   No maths here, and nothing fetched: the frames are in the page, as JSON. */
(function () {
  "use strict";

  function wire(root) {
    var source = root.querySelector("script.page-explorer-data");
    var panel = root.querySelector(".page-explorer-controls");
    if (!source || !panel || root.dataset.wired) return;
    var data = JSON.parse(source.textContent);
    var image = root.querySelector("img.page-explorer-frame");
    var readout = root.querySelector("output.page-explorer-readout");
    var fields = data.controls.map(function (control) {
      return root.querySelector('[name="' + control.name + '"]');
    });

    function show() {
      var index = 0;
      data.controls.forEach(function (control, k) {
        var position = Number(fields[k].value);
        index = index * data.shape[k] + position;
        if (control.kind === "slider") {
          var text = control.text[position];
          fields[k].setAttribute("aria-valuetext", text);
          var value = root.querySelector('output[for="' + fields[k].id + '"]');
          if (value) value.textContent = text;
        }
      });
      var frame = data.frames[index];
      image.src = frame.image;
      image.alt = frame.alt;
      readout.textContent = frame.readout;
      root.dataset.state = String(index);
    }

    fields.forEach(function (field) {
      field.addEventListener("input", show);
      field.addEventListener("change", show);
    });
    panel.hidden = false;
    root.dataset.wired = "true";
    show();
  }

  // A second skip link, beside the theme's "Skip to main content": on a notebook's page the
  // explorer may sit below dozens of code cells and links; with it, its first control is three
  // presses of Tab (and an Enter) from the top of the page (issue 27).
  function skipLink() {
    var first = document.querySelector(".page-explorer[id]");
    var skip = document.getElementById("pst-skip-link");
    if (!first || !skip || skip.querySelector(".skip-to-explorer")) return;
    var link = document.createElement("a");
    link.href = "#" + first.id;
    link.className = "skip-to-explorer";
    link.textContent = "Skip to the explorer";
    skip.appendChild(document.createTextNode(" "));
    skip.appendChild(link);
  }

  function wireAll() {
    document.querySelectorAll(".page-explorer").forEach(wire);
    skipLink();
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", wireAll);
  } else {
    wireAll();
  }
})();
