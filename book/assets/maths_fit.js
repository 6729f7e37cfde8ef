/* Display equations that fit a narrow column (issue 27).

   The offline MathJax is 3.2, which breaks no display equation into lines (MathJax 4 does).  On a
   phone most of the book's display equations are wider than the 342-px column.  Once MathJax has
   typeset the page (and again when the window changes size) each display equation wider than its
   column, less the room its number takes (on a phone the number goes above it), is set in a smaller
   size that fits, down to MIN_SCALE of its size and MIN_PX; one that still does not fit keeps that and
   scrolls inside its box, marked `maths-scrolls` (the CSS draws a shadow at the hidden edge).
   Nothing changes where an equation fits: on a desktop no equation is touched.  An inline formula
   wider than its line is marked `maths-scrolls-inline` and scrolls; only marked formulas are
   scroll containers (Chromium puts every scroll container in the Tab order). */
(function () {
  "use strict";

  var MIN_SCALE = 0.6; // of MathJax's size (about 19.8 px for the body's maths)
  var MIN_PX = 11; // and never under 11 px

  function fitOne(box) {
    var holder = box.closest("div.math") || box.parentElement;
    if (box.dataset.fitSize === undefined) {
      // MathJax sets its own scale on the container (an inline font-size such as 123.7%, matched
      // to the text's x-height): kept, and restored before each measure, or the equation would be
      // measured at the text's size and then set at MathJax's, wider than measured.
      box.dataset.fitStyle = box.style.fontSize;
      box.dataset.fitSize = parseFloat(getComputedStyle(box).fontSize);
    }
    var size = Number(box.dataset.fitSize);
    box.style.fontSize = box.dataset.fitStyle;
    holder.classList.remove("maths-scrolls");
    var number = holder.querySelector(".eqno");
    var beside = number && getComputedStyle(holder).flexDirection.indexOf("row") === 0;
    var room = holder.clientWidth - (beside ? number.getBoundingClientRect().width + 8 : 0);
    var math = box.querySelector("mjx-math") || box;
    var width = math.getBoundingClientRect().width;
    if (room <= 0 || width <= room) return;
    var scale = Math.max(MIN_SCALE, MIN_PX / size, (room - 2) / width);
    box.style.fontSize = (size * scale).toFixed(2) + "px";
    if ((box.querySelector("mjx-math") || box).getBoundingClientRect().width > room + 1) {
      holder.classList.add("maths-scrolls");
    }
  }

  function fitInline(box) {
    box.classList.remove("maths-scrolls-inline");
    var column = (box.closest("p, li, dd, td, div") || document.body).clientWidth;
    if (box.getBoundingClientRect().width > column + 1) box.classList.add("maths-scrolls-inline");
  }

  function fitAll() {
    document.querySelectorAll('div.math mjx-container[display="true"]').forEach(fitOne);
    document.querySelectorAll('mjx-container:not([display="true"])').forEach(fitInline);
    // a sign for the book's browser tests that the page is typeset and fitted
    document.documentElement.dataset.mathsFitted = "true";
  }

  function watchResize() {
    var timer = null;
    var lastWidth = window.innerWidth;
    window.addEventListener("resize", function () {
      if (window.innerWidth === lastWidth) return; // a phone's toolbar showing or hiding
      lastWidth = window.innerWidth;
      clearTimeout(timer);
      timer = setTimeout(fitAll, 150);
    });
  }

  // This script is deferred ahead of MathJax's: when it runs, window.MathJax is still the page's
  // configuration, and MathJax's documented hook (startup.pageReady) runs the fit right after the
  // first typesetting.  (MathJax.startup.promise, read earlier, resolves before it.)
  var config = window.MathJax;
  if (config && !config.version) {
    config.startup = config.startup || {};
    var before = config.startup.pageReady;
    config.startup.pageReady = function () {
      var ready = before ? before() : MathJax.startup.defaultPageReady();
      return Promise.resolve(ready).then(fitAll);
    };
    watchResize();
  } else if (config && config.startup && config.startup.promise) {
    config.startup.promise.then(fitAll);
    watchResize();
  }
})();
