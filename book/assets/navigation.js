/* The table of contents on every width (issue 27).

   sphinx-book-theme 1.3.0 draws its own "Toggle primary sidebar" button in the article's header,
   with the class `primary-toggle`; pydata-sphinx-theme 0.17 draws a second one, hidden, in its
   navbar.  Both themes bind only `document.querySelector(".primary-toggle")`, the first in the
   page: the hidden one (pydata-sphinx-theme issue 2451).  The button a reader sees got no handler,
   so the contents never opened on a phone or a tablet.  Here every other toggle forwards its click
   to the bound one, so the themes' own behaviour runs: on a wide screen (>= 992 px) the sidebar
   folds away and back, on a narrower one it opens as a modal dialog.  The dialog gets a Close
   button (it also closes with Escape or a tap beside it), and each toggle says whether the
   contents are shown (`aria-expanded`). */
(function () {
  "use strict";

  function setup() {
    ["primary", "secondary"].forEach(function (side) {
      var toggles = document.querySelectorAll("." + side + "-toggle");
      var sidebar = document.getElementById("pst-" + side + "-sidebar");
      var dialog = document.getElementById("pst-" + side + "-sidebar-modal");
      if (toggles.length < 2 || !sidebar || !dialog) return;
      var bound = toggles[0];
      var visible = Array.prototype.slice.call(toggles, 1);

      function expanded() {
        if (dialog.open) return true;
        if (!window.matchMedia("(min-width: 992px)").matches) return false;
        return !sidebar.classList.contains("pst-sidebar-hidden") && sidebar.offsetWidth > 0;
      }
      function mark() {
        var state = String(expanded());
        visible.forEach(function (button) { button.setAttribute("aria-expanded", state); });
      }

      visible.forEach(function (button) {
        button.setAttribute("aria-controls", "pst-" + side + "-sidebar");
        button.addEventListener("click", function (event) {
          event.preventDefault();
          event.stopPropagation();
          bound.click();
          // the themes move focus back to the hidden button on close; the reader's is this one
          if (dialog.open) {
            dialog.addEventListener("close", function () { button.focus(); }, { once: true });
          }
          mark();
        });
      });

      // A Close button for the dialog: it travels with the sidebar's contents into the dialog and
      // back (the theme moves every child), and the CSS shows it only inside the open dialog.
      if (side === "primary" && !sidebar.querySelector(".toc-close")) {
        var close = document.createElement("button");
        close.type = "button";
        close.className = "toc-close";
        close.textContent = "Close contents";
        close.addEventListener("click", function () { dialog.close(); mark(); });
        sidebar.insertBefore(close, sidebar.firstChild);
      }
      // The dialog's "close" event is queued as a task after close() (HTML spec), so a reader or a
      // screen reader asking straight away would hear the stale state; the open attribute changes
      // at once, and an observer of it marks the toggles within the same task.
      dialog.addEventListener("close", mark);
      if (window.MutationObserver) {
        new MutationObserver(mark).observe(dialog, { attributes: true, attributeFilter: ["open"] });
      }
      window.addEventListener("resize", mark);
      mark();
    });
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", setup);
  } else {
    setup();
  }
})();

/* Search results without raw TeX (issue 27).  Sphinx's search page writes each result's snippet
   from the page's HTML text, where a formula is still its TeX source ("\(\operatorname{softmax}
   (s/\tau)\)"): MathJax typesets only the page it runs on.  Before the text is taken, each formula
   is replaced by a plain reading of it: delimiters dropped, Greek letters as letters, other
   commands, braces and scripts' marks removed.  Only the search page loads Sphinx's searchtools. */
(function () {
  "use strict";
  if (typeof Search === "undefined" || typeof Search.htmlToText !== "function") return;
  var GREEK = {alpha: "α", beta: "β", gamma: "γ", delta: "δ", epsilon: "ε", varepsilon: "ε", eta: "η",
               theta: "θ", kappa: "κ", lambda: "λ", mu: "μ", nu: "ν", xi: "ξ", pi: "π", rho: "ρ",
               sigma: "σ", tau: "τ", phi: "φ", varphi: "φ", chi: "χ", psi: "ψ", omega: "ω",
               Gamma: "Γ", Delta: "Δ", Theta: "Θ", Lambda: "Λ", Sigma: "Σ", Phi: "Φ", Psi: "Ψ",
               Omega: "Ω", infty: "∞", le: "≤", leq: "≤", ge: "≥", geq: "≥", in: "∈", cdot: "·",
               times: "×", to: "→", sum: "Σ", prod: "∏", int: "∫", partial: "∂", nabla: "∇"};

  function plain(tex) {
    return tex
      .replace(/^\s*(\\\(|\\\[|\$\$?)|(\\\)|\\\]|\$\$?)\s*$/g, "")
      .replace(/\\(?:begin|end)\{[a-z*]+\}/g, " ")
      .replace(/\\([A-Za-z]+)/g, function (_, name) { return GREEK[name] !== undefined ? GREEK[name] : " "; })
      .replace(/\\[,;:!| ]/g, " ")
      .replace(/[{}]|&|\\\\/g, " ")
      .replace(/[_^]/g, "")
      .replace(/\s+/g, " ")
      .trim();
  }

  var original = Search.htmlToText;
  Search.htmlToText = function (htmlString, anchor) {
    var doc = new DOMParser().parseFromString(htmlString, "text/html");
    doc.querySelectorAll(".math").forEach(function (el) {
      el.querySelectorAll(".eqno").forEach(function (n) { n.remove(); });
      el.textContent = " " + plain(el.textContent) + " ";
    });
    return original.call(Search, doc.documentElement.outerHTML, anchor);
  };
})();
