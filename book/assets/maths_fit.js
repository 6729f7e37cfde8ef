/* Display equations that fit a narrow column (issue 27).

   The offline MathJax is 3.2, which breaks no display equation into lines (MathJax 4 does).  On a
   phone most of the book's display equations are wider than the 342-px column.  Once MathJax has
   typeset the page (and again when the window changes size) each display equation wider than its
   column, less the room its number takes, is set in a smaller size that fits, down to MIN_SCALE of
   its size (about 11.5 px for the body's maths); one that still does not fit keeps MIN_SCALE and
   scrolls inside its box, marked `maths-scrolls` (the CSS draws a shadow at the hidden edge).
   Nothing changes where an equation fits: on a desktop no equation is touched. */
(function () {
  "use strict";

  var MIN_SCALE = 0.72;

  function fitOne(box) {
    var holder = box.closest("div.math") || box.parentElement;
    if (box.dataset.fitSize === undefined) {
      box.dataset.fitSize = parseFloat(getComputedStyle(box).fontSize);
    }
    var size = Number(box.dataset.fitSize);
    box.style.fontSize = "";
    holder.classList.remove("maths-scrolls");
    var number = holder.querySelector(".eqno");
    var room = holder.clientWidth - (number ? number.getBoundingClientRect().width + 8 : 0);
    var math = box.querySelector("mjx-math") || box;
    var width = math.getBoundingClientRect().width;
    if (room <= 0 || width <= room) return;
    var scale = Math.max(MIN_SCALE, (room - 2) / width);
    box.style.fontSize = (size * scale).toFixed(2) + "px";
    if ((box.querySelector("mjx-math") || box).getBoundingClientRect().width > room + 1) {
      holder.classList.add("maths-scrolls");
    }
  }

  function fitAll() {
    document.querySelectorAll('div.math mjx-container[display="true"]').forEach(fitOne);
  }

  function start() {
    if (!window.MathJax || !MathJax.startup || !MathJax.startup.promise) return;
    MathJax.startup.promise.then(fitAll);
    var timer = null;
    var lastWidth = window.innerWidth;
    window.addEventListener("resize", function () {
      if (window.innerWidth === lastWidth) return; // a phone's toolbar showing or hiding
      lastWidth = window.innerWidth;
      clearTimeout(timer);
      timer = setTimeout(fitAll, 150);
    });
  }

  // MathJax's script is deferred after this one; by DOMContentLoaded it has started.
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
