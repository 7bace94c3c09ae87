// ipywidgets' HTML manager (embed-amd.js) typesets widget labels with MathJax 2's API,
// MathJax.Hub.Queue(["Typeset", MathJax.Hub, element]), while the book and the slides load
// MathJax 3, which has no Hub: the saved widgets then threw "Cannot read properties of undefined
// (reading 'Queue')". This maps that one call onto MathJax 3, queueing elements that arrive
// before MathJax has started. Runs after the MathJax 3 configuration and before MathJax loads.
(function () {
  if (!window.MathJax || window.MathJax.version) return; // no math on the page, or MathJax 2
  var pending = [];
  var hub = {
    Queue: function (command) {
      if (!Array.isArray(command) || command[0] !== "Typeset") return;
      if (window.MathJax.typesetPromise) window.MathJax.typesetPromise([command[2]]);
      else pending.push(command[2]);
    },
  };
  var startup = window.MathJax.startup || {};
  var ready = startup.ready;
  window.MathJax.Hub = hub;
  window.MathJax.startup = Object.assign(startup, {
    ready: function () {
      if (ready) ready(); else window.MathJax.startup.defaultReady();
      window.MathJax.Hub = hub;
      if (pending.length) window.MathJax.typesetPromise(pending.splice(0));
    },
  });
})();
