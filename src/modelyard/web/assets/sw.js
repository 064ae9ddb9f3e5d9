// The site's service worker: after one visit the app starts and classifies with no network.
// `modelyard convert --to web` fills in the two cache names: the app's (page, config, model,
// manifest, icons) carries a content hash of the site, the runtime's the LiteRT.js version, so a
// new convert replaces the old app cache while an unchanged runtime (~9 MB of wasm) is kept.
const APP_CACHE = '__APP_CACHE__';
const RUNTIME_CACHE = '__RUNTIME_CACHE__';
const OURS = 'modelyard-';
const scope = new URL(self.registration.scope);

function cacheFor(url) {
  return new URL(url).pathname.startsWith(scope.pathname + 'runtime/') ? RUNTIME_CACHE : APP_CACHE;
}

// No precache on install: the page says what it used (below) and those files are cached from the
// browser's HTTP cache (a revalidation each, 304 when unchanged), so nothing is downloaded twice.
self.addEventListener('install', () => self.skipWaiting());

self.addEventListener('activate', (event) => {
  event.waitUntil((async () => {
    for (const name of await caches.keys()) {
      if (name.startsWith(OURS) && name !== APP_CACHE && name !== RUNTIME_CACHE) await caches.delete(name);
    }
    // No clients.claim(): a first visit's page loads straight from the network (nothing in its
    // way while the wasm compiles) and has its files cached afterwards; the next load is served.
  })());
});

// The response goes to the page at once (the wasm compiles while it streams in); its copy is
// written to the cache meanwhile, the event kept alive until it is.
async function fromNetwork(event) {
  const request = event.request;
  const response = await fetch(request);
  if (response.ok && response.type === 'basic') {
    const copy = response.clone();
    event.waitUntil(caches.open(cacheFor(request.url)).then((cache) => cache.put(request, copy)));
  }
  return response;
}

self.addEventListener('fetch', (event) => {
  const request = event.request;
  if (request.method !== 'GET' || new URL(request.url).origin !== scope.origin) return;
  if (request.mode === 'navigate') {
    // The page first from the network (a new convert shows on the next online load), else the copy.
    event.respondWith(fromNetwork(event).catch(async () =>
      (await caches.match(request, {ignoreSearch: true})) || (await caches.match(scope.href)) ||
      new Response('offline, and this page was never loaded online', {status: 503})));
    return;
  }
  // Everything else is versioned (?v=HASH) or keyed by the runtime's version: the copy, if any.
  event.respondWith(caches.match(request).then((hit) => hit || fromNetwork(event)));
});

// The page lists the URLs it loaded; the ones not cached yet (fetched before this worker took
// control, or cached by an older worker whose cache is gone) are fetched now. The reply says
// which version is cached, so the page can tell "works offline" only when it is its own.
self.addEventListener('message', (event) => {
  if (!event.data || event.data.type !== 'cache') return;
  const port = event.ports[0];
  event.waitUntil((async () => {
    try {
      for (const url of event.data.urls) {
        // This worker's own cache, not any: an older worker may have kept it in a cache about to go.
        const cache = await caches.open(cacheFor(url));
        if (!(await cache.match(url))) await cache.add(url);
      }
      port.postMessage({cached: APP_CACHE, runtime: RUNTIME_CACHE});
    } catch (error) {
      port.postMessage({error: String(error), cached: APP_CACHE});
    }
  })());
});
