// Saved ipywidgets state is rendered, in the book and in the slides, by ipywidgets' HTML manager
// (embed-amd.js, vendored). It finds its Font Awesome files next to the URL that RequireJS gives
// its module, "@jupyter-widgets/html-manager/dist/...", which by default is resolved against the
// page ("chapters/@jupyter-widgets/..."): a 404 on every page with a widget (tqdm bars included).
// This maps the module to the vendored copy. It must run before the manager loads: in the book
// it runs before RequireJS (a global `require` object is RequireJS's way to take configuration),
// in the slides just after it.
(function () {
  var root = document.documentElement.dataset.content_root; // set on Sphinx pages
  var base = root !== undefined ? root + "_static/" : "_vendor/"; // slide decks sit by _vendor/
  var dist = new URL(base + "html-manager/dist", location.href).href;
  var config = {paths: {"@jupyter-widgets/html-manager/dist": dist}};
  if (typeof window.require === "function") window.require.config(config);
  else window.require = config;
})();
