"""The HTML page of `pipelines.report.page`: style, layout and the trajectory explorer's
script, all inline (the page works offline). Filled with `str.format`, so literal
braces are doubled."""

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>Run report: {title}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 1320px; color: #222; }}
h1 {{ font-size: 1.5em; }} h2 {{ border-bottom: 1px solid #ccc; padding-bottom: .2em; }}
.plots {{ display: grid; grid-template-columns: repeat(auto-fill, minmax(380px, 1fr)); gap: 12px; }}
figure {{ margin: 0; }} img.plot {{ width: 100%; height: auto; }}
.summary {{ background: #f3f6fa; border-left: 4px solid #3a6ea5; padding: .6em .9em; margin: .6em 0; line-height: 1.6; }}
@media (max-width: 600px) {{ .plots {{ grid-template-columns: 1fr; }} body {{ margin: .5em; }} }}
table {{ border-collapse: collapse; font-size: .85em; margin: .4em 0; }}
td, th {{ border: 1px solid #ddd; padding: 2px 6px; text-align: left; }}
pre {{ background: #f6f6f6; padding: .6em; overflow-x: auto; }}
#explorer select {{ margin-right: 1em; }}
#turn-view {{ border: 1px solid #ccc; padding: .8em; margin-top: .6em; min-height: 12em; }}
.state {{ font-family: monospace; font-size: 1.3em; line-height: 1.15; }}
.ok {{ color: #176e17; }} .bad {{ color: #b00; }}
</style></head>
<body>
<h1>Run report: {title}</h1>
<section id="summary"><h2>At a glance</h2>
{summary}
</section>
<p>Early-warning rules: {rules}. Red crosses on the curves mark where a warning fired.</p>
<h2>Curves</h2>
<div class="plots">
{plots}
</div>
{runs}
<section id="explorer">
<h2>Trajectory explorer ({explorer_run})</h2>
<label>env <select id="pick-env"></select></label>
<label>iteration <select id="pick-iteration"></select></label>
<label>group <select id="pick-group"></select></label>
<label>trajectory <select id="pick-trajectory"></select></label>
<div>
<button id="turn-prev">&#9664; previous turn</button>
<button id="turn-next">next turn &#9654;</button>
<span id="turn-label"></span>
</div>
<div id="turn-view" data-turn="0"></div>
</section>
<script id="trajectories" type="application/json">{data}</script>
<script>
(function () {{
  const all = JSON.parse(document.getElementById("trajectories").textContent);
  const $ = (id) => document.getElementById(id);
  const esc = (s) => String(s == null ? "" : s).replace(/[&<>"]/g, (c) => ({{"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;"}})[c]);
  const uniq = (xs) => Array.from(new Set(xs)).sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
  let turn = 0;
  function fill(select, values, label) {{
    const keep = select.value;
    select.innerHTML = values.map((v) => `<option value="${{esc(v)}}">${{esc(label ? label(v) : v)}}</option>`).join("");
    if (values.map(String).includes(keep)) select.value = keep;
  }}
  function chosen() {{
    return all.filter((t) => t.env === $("pick-env").value && String(t.iteration) === $("pick-iteration").value
      && String(t.group) === $("pick-group").value);
  }}
  function refresh(level) {{
    if (!all.length) {{ $("turn-view").textContent = "No stored trajectories for this run."; return; }}
    if (level <= 0) fill($("pick-env"), uniq(all.map((t) => t.env)));
    const inEnv = all.filter((t) => t.env === $("pick-env").value);
    if (level <= 1) fill($("pick-iteration"), uniq(inEnv.map((t) => t.iteration)));
    const inIt = inEnv.filter((t) => String(t.iteration) === $("pick-iteration").value);
    if (level <= 2) fill($("pick-group"), uniq(inIt.map((t) => t.group)));
    if (level <= 3) fill($("pick-trajectory"), chosen().map((t) => t.sample),
      (s) => {{ const t = chosen().find((x) => x.sample === s); return `#${{s}} score ${{t.score.toFixed(2)}}${{t.success ? " (success)" : ""}}`; }});
    if (level <= 3) turn = 0;
    show();
  }}
  function show() {{
    const traj = chosen().find((t) => String(t.sample) === $("pick-trajectory").value);
    if (!traj) return;
    turn = Math.max(0, Math.min(turn, traj.turns.length - 1));
    const t = traj.turns[turn];
    const actions = (t.actions || []).map((a, i) => `<span class="${{t.valid[i] ? "ok" : "bad"}}">${{esc(a)}} ${{t.valid[i] ? "&#10003;" : "&#10007;"}}</span>`).join(", ");
    $("turn-label").textContent = `turn ${{turn + 1}} / ${{traj.turns.length}}`;
    $("turn-view").dataset.turn = String(turn);
    $("turn-view").innerHTML =
      `<p><b>Turn ${{t.turn}}</b> &middot; reward ${{t.reward}} &middot; format ${{t.format_ok ? "ok" : "broken"}} &middot; ${{t.executed}} action(s) executed</p>` +
      `<p>State:</p><pre class="state">${{esc(t.state)}}</pre>` +
      `<p>Think: <i>${{esc(t.think) || "&mdash;"}}</i></p>` +
      `<p>Answer: <code>${{esc(t.answer)}}</code></p>` +
      `<p>Actions: ${{actions || "none parsed"}}</p>` +
      `<p>Trajectory: score ${{traj.score}}, ${{traj.success ? "success" : "no success"}}, ended by ${{esc(traj.end_reason)}}</p>`;
  }}
  $("pick-env").onchange = () => refresh(1);
  $("pick-iteration").onchange = () => refresh(2);
  $("pick-group").onchange = () => refresh(3);
  $("pick-trajectory").onchange = () => {{ turn = 0; show(); }};
  $("turn-prev").onclick = () => {{ turn -= 1; show(); }};
  $("turn-next").onclick = () => {{ turn += 1; show(); }};
  refresh(0);
}})();
</script>
</body></html>
"""
