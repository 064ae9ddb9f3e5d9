// The Pipelines pages (platform_pipelines.py): with an --auth-token, the fragment is fetched with the token
// the console keeps for this tab; while a run shown is still going, the fragment is fetched again every 2 s.
// The server renders and escapes everything (the graph is its SVG); this script only swaps it in.
'use strict';

const TOKEN_KEY = 'modelyard-platform-token';
const REFRESH_MS = 2000;

async function refresh() {
  const token = sessionStorage.getItem(TOKEN_KEY) || '';
  const answer = await fetch('/console/pipelines/live' + window.location.search,
                             {headers: token ? {Authorization: `Bearer ${token}`} : {}});
  if (!answer.ok) return false;
  document.getElementById('live').innerHTML = await answer.text();
  showLogEnds();
  return true;
}

// A task's log is shown from its end, where a failure says why.
function showLogEnds() {
  document.querySelectorAll('pre.log').forEach((pre) => { pre.scrollTop = pre.scrollHeight; });
}

function running() {
  return document.querySelector('#live [data-running="1"]') !== null;
}

async function start() {
  showLogEnds();
  if (document.body.dataset.locked === '1') {
    if (!sessionStorage.getItem(TOKEN_KEY) || !(await refresh())) return;
  }
  const tick = async () => {
    if (running()) await refresh().catch(() => false);
    if (running()) setTimeout(tick, REFRESH_MS);
  };
  setTimeout(tick, REFRESH_MS);
}

window.addEventListener('load', start);
