"""kneeswarm in Locust's web UI: the plan in the start form, the "Knee" tabs, the report served.

    the start form   --kneeswarm-steps/-ramp/-hold/-settle/-protocol/-model are custom arguments
                     shown in the form (include_in_web_ui), filled with the plan's values; the
                     users/rate fields stay hidden (the step shape drives the load)
    Knee tab         the live step table (users, QPS, P50/P99, errors, valid, why a probe was chosen)
                     under a chart of QPS and P99 against users (and a traffic mix's P99 per class) (plotly.js from the installed plotly
                     package, served here: no CDN), each step labelled with its number and why, the
                     knee marked once known (LiveKnee); with [load] repeat, which repetition of the
                     Start's series is running above it, and the merged report's link (LiveRepeat)
    Knee classes     a traffic mix ([[request.classes]]): per class its requests so far and their share
                     against its weight's, the current step's requests, QPS, P99 and errors, and its
                     knees once the report is written (LiveClass)
    Knee servers     the latest server metrics per monitored host (CPU us/sy, cs/s, run queue,
                     busiest thread, GPU)
    /kneeswarm/...   live.json (both tables, the knee and the report's URL once written), runs/<id>/...
                     the run directories under --kneeswarm-out (their reports), knee.js (the report
                     link shown on every page once the report is written, the Knee tab's chart),
                     plotly.js

Binding: the web UI binds 127.0.0.1 unless --web-host is given; a non-loopback --web-host needs
--web-login (credentials from KNEESWARM_WEB_USER / KNEESWARM_WEB_PASSWORD) or --kneeswarm-insecure-web.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
from pathlib import Path
from typing import Any, Callable, NotRequired, TypedDict

from flask import Response, jsonify, request, send_from_directory

from kneeswarm.contracts.plan import PROTOCOLS

logger = logging.getLogger(__name__)

LOOPBACK = ("127.0.0.1", "localhost", "::1")
USER_ENV, PASSWORD_ENV = "KNEESWARM_WEB_USER", "KNEESWARM_WEB_PASSWORD"
#: (option, plan key, help) of the plan fields in the start form
PLAN_FIELDS = (  # in the order a user thinks: what, then how the steps are chosen, then how each is held
    ("kneeswarm_protocol", "protocol", "request protocol: kserve, openai, torchserve, tfserving, http, or over gRPC "
                                       "kserve-grpc, triton-stream, torchserve-grpc"),
    ("kneeswarm_model", "request.model", "model name in the request path"),
    ("kneeswarm_mode", "load.mode", "grid (the steps below) or search (probes chosen from start to max)"),
    ("kneeswarm_steps", "load.steps", "grid: users per step, e.g. 1,2,4,8"),
    ("kneeswarm_start", "load.start", "search: the first probe (users)"),
    ("kneeswarm_max", "load.max", "search: never beyond this many users"),
    ("kneeswarm_growth", "load.growth", "search: each probe multiplies the last by this until one saturates"),
    ("kneeswarm_precision", "load.precision", "search: knee bracketed within max(1 user, this share)"),
    ("kneeswarm_max_duration", "load.max_duration", "search: seconds of load at most"),
    ("kneeswarm_ramp", "load.ramp", "seconds to ramp to each step"),
    ("kneeswarm_hold", "load.hold", "seconds each step is held after its ramp, or auto (until steady and known)"),
    ("kneeswarm_settle", "load.settle", "seconds after each ramp left out of the step's statistics"),
    ("kneeswarm_repeat", "load.repeat", "runs of the plan one Start makes, each its own report, then merged"),
    ("kneeswarm_cooldown", "load.cooldown", "repeat: seconds between two runs"),
)
#: plan keys of the start form whose values are a list to choose from (the web UI shows a menu)
CHOICES = {"protocol": PROTOCOLS}
#: plan keys of the start form that are numbers (the others are words, or the steps' list)
NUMBER_KEYS = ("load.ramp", "load.hold", "load.settle", "load.start", "load.max", "load.growth", "load.precision",
               "load.max_duration", "load.cooldown")
INTEGER_KEYS = ("load.repeat",)  # plan keys of the start form that are whole numbers
STEP_COLUMNS = [("step", "Step"), ("users", "Users"), ("state", "State"), ("requests", "Requests"),
                ("qps", "QPS"), ("p50_ms", "P50 ms"), ("p99_ms", "P99 ms"), ("errors", "Errors"),
                ("valid", "Valid"), ("why", "Why (search)")]
CLASS_COLUMNS = [("class", "Class"), ("weight_pct", "Weight %"), ("requests", "Requests"), ("share_pct", "Share %"),
                 ("step", "Step"), ("users", "Users"), ("step_requests", "Step requests"), ("qps", "QPS"),
                 ("p99_ms", "P99 ms"), ("errors", "Errors"), ("knee", "Knee (users)"),
                 ("latency_knee", "P99 knee (users)")]
HOST_COLUMNS = [("host", "Host"), ("cpu_us", "CPU us %"), ("cpu_sy", "CPU sy %"), ("cs_s", "cs/s"),
                ("run_queue", "Run queue"), ("busiest_thread", "Busiest thread"), ("gpu_sm_pct", "GPU SM %")]


class LiveStep(TypedDict):
    """A row of the Knee tab (STEP_COLUMNS): one step so far, from kneeswarm.launch.lifecycle.live_steps;
    the report's figures replace them when it is written (kneeswarm.locustfiles.plugin)."""
    name: str
    step: int
    users: int
    state: str  # "ramp", "steady", "done"
    requests: int
    qps: float | None
    p50_ms: float | None
    p99_ms: float | None
    errors: int
    valid: str  # "so far", "too few"; after the report "yes" or "no: <reasons>"
    why: str  # mode = "search": why the master chose this probe (generator/search.json); "" otherwise


#: A row of the Knee classes tab (CLASS_COLUMNS): a traffic mix's class so far, from
#: kneeswarm.launch.lifecycle.live_classes: its rows in every step so far and their share of the rows with
#: a class beside its weight's share; the current step's (the last begun) requests, QPS and P99 of its
#: steady rows, errors; its knees (users at its own QPS knee, where its P99 took off) from the summary
#: once the report is written (kneeswarm.locustfiles.plugin): "" before, "none" when it found none.
#: Said in TypedDict's functional form: "class" is a Python keyword.
LiveClass = TypedDict("LiveClass", {
    "name": str, "class": str, "weight_pct": float | None, "requests": int, "share_pct": float | None,
    "step": int | None, "users": int | float | None, "step_requests": int, "qps": float | None,
    "p99_ms": float | None, "errors": int, "knee": str | float, "latency_knee": str | float})


#: A traffic mix: one class's figures at one step so far (kneeswarm.launch.lifecycle.live_class_steps), a point
#: of its P99 line on the Knee tab's chart.
LiveClassStep = TypedDict("LiveClassStep", {"class": str, "step": int, "users": int | float, "qps": float | None,
                                            "p99_ms": float | None})


class LiveHost(TypedDict, total=False):
    """A row of the Knee servers tab (HOST_COLUMNS): a host's latest parsed samples, from
    kneeswarm.launch.lifecycle.live_hosts; a table the host lacks leaves its keys out."""
    name: str
    host: str
    t: float | None
    cpu_us: float | None
    cpu_sy: float | None
    cs_s: float | None
    run_queue: float | None
    busiest_thread: str
    gpu_sm_pct: float | None


class LiveKnee(TypedDict, total=False):
    """The knee as far as it is known, marked on the Knee tab's chart: during the run from
    kneeswarm.launch.lifecycle.live_knee, after it from the summary (kneeswarm.locustfiles.plugin); {} while unknown."""
    users: float  # the knee's users (a grid's detector, or the report's)
    bracket: list[Any]  # mode = "search": [last scaling probe, first saturated probe or the bounds' upper end]
    how: str  # where it comes from, shown beside the mark


class Live(TypedDict):
    """Both tables and the knee: the lifecycle process's answer to "live" and "fetch"."""
    steps: list[LiveStep]
    hosts: list[LiveHost]
    knee: NotRequired[LiveKnee]
    classes: NotRequired[list[LiveClass]]  # a traffic mix ([[request.classes]]): the Knee classes tab
    class_steps: NotRequired[list[LiveClassStep]]  # a traffic mix: each class's P99 line on the Knee tab's chart


class LiveRepeat(TypedDict, total=False):
    """``[load] repeat`` in the web UI (kneeswarm.locustfiles.series): which repetition of a Start's
    series is running, shown above the Knee tab's chart, and the merged report once written."""
    index: int  # the repetition running (or last run), from 1
    of: int  # repetitions asked for
    state: str  # "running", "cooldown", "merging", "done", "stopped"
    text: str  # what the Knee tab shows
    runs: list[str]  # the run directories of the series so far
    next_in_s: float  # state "cooldown": seconds until the next repetition starts
    report_url: str  # the merged result's page
    report_error: str  # why it was not written


class ReportLink(TypedDict, total=False):
    """The report's link once written, or why there is none."""
    report_url: str
    report_error: str


class LiveJson(Live, ReportLink, total=False):
    """/kneeswarm/live.json: the tables, the run, and the report's link."""
    run_id: str
    repeat: LiveRepeat  # a Start that runs a series (plan repeat > 1)


KNEE_JS = """(function () {
  function poll() {
    fetch('/kneeswarm/live.json').then(function (r) { return r.json(); }).then(function (d) {
      var a = document.getElementById('kneeswarm-report-link');
      if (d.report_url) {
        if (!a) {
          a = document.createElement('a'); a.id = 'kneeswarm-report-link'; a.target = '_blank';
          a.style.cssText = 'position:fixed;right:16px;bottom:16px;z-index:9999;padding:8px 14px;' +
            'background:#1b5e20;color:#fff;border-radius:6px;font:14px sans-serif;text-decoration:none';
          document.body.appendChild(a);
        }
        a.href = d.report_url; a.textContent = 'Knee report: ' + d.run_id;
      } else if (a) { a.remove(); }
      live = d; chart(); repetition();
    }).catch(function () {});
  }
  var seen_index = null, reload_for = null;
  function follow(r) {
    // Locust's page stops asking for its stats once a test stops, and does not see a test it did not
    // start: when the series starts its next repetition, the page is loaded again once that test runs
    if (seen_index !== null && r.index !== seen_index && r.state === 'running') { reload_for = r.index; }
    seen_index = r.index;
    if (reload_for === null) { return; }
    fetch('/stats/requests').then(function (x) { return x.json(); }).then(function (st) {
      if (st.state === 'running' || st.state === 'spawning') { reload_for = null; location.reload(); }
    }).catch(function () {});
  }
  function repetition() {  // [load] repeat: which repetition is running, above the Knee tab's chart
    if (live && live.repeat) { follow(live.repeat); }
    var table = knee_tab(), box = document.getElementById('kneeswarm-repeat');
    if (!table || !live || !live.repeat) { if (box && !(live && live.repeat)) { box.remove(); } return; }
    if (!box || !box.isConnected) {
      box = document.createElement('div'); box.id = 'kneeswarm-repeat';
      box.style.cssText = 'font:15px sans-serif;margin:8px 0;padding:6px 10px;background:#e8f0fe;border-radius:4px';
      var at = document.getElementById('kneeswarm-chart') || table.closest('.MuiTableContainer-root') || table;
      at.parentNode.insertBefore(box, at);
    }
    var r = live.repeat, text = r.text + (r.next_in_s !== undefined ? ' (in ' + Math.ceil(r.next_in_s) + ' s)' : '');
    box.setAttribute('data-index', r.index); box.setAttribute('data-state', r.state);
    box.textContent = text;
    if (r.report_url) {
      var a = document.createElement('a'); a.id = 'kneeswarm-repeat-link'; a.href = r.report_url; a.target = '_blank';
      a.textContent = 'merged report'; a.style.marginLeft = '10px';
      box.appendChild(a);
    } else if (r.report_error) { box.appendChild(document.createTextNode(' (merge failed: ' + r.report_error + ')')); }
  }
  var opened = false;
  function form() {
    // the step plan drives the load: Locust's users/rate fields are hidden, the plan's fields shown
    ['userCount', 'spawnRate'].forEach(function (n) {
      var i = document.querySelector('input[name=' + n + ']');
      var box = i && i.closest('.MuiFormControl-root');
      if (box && box.style.display !== 'none') { box.style.display = 'none'; }
    });
        var user = document.querySelector('input[name=userCount]');
    if (user && !document.getElementById('kneeswarm-plan-note')) {
      var note = document.createElement('p'); note.id = 'kneeswarm-plan-note';
      note.textContent = 'The step plan drives the load: edit its steps, ramp, hold and settle under Custom parameters.';
      note.style.cssText = 'font:14px sans-serif;margin:8px 0';
      var f = user.closest('form'); if (f) { f.insertBefore(note, f.firstChild); }
    }
    if (user && !opened) {
      opened = true;
      Array.prototype.forEach.call(document.querySelectorAll('.MuiAccordionSummary-root'), function (s) {
        if (/Custom parameters/.test(s.textContent) && s.getAttribute('aria-expanded') !== 'true') { s.click(); }
      });
    }
  }
  var live = null, loading = false;
  function knee_tab() {  // the Knee tab's table (its "Why (search)" column), when it is shown
    var ths = document.querySelectorAll('th');
    for (var i = 0; i < ths.length; i++) {
      if (ths[i].textContent === 'Why (search)') { return ths[i].closest('table'); }
    }
    return null;
  }
  function chart() {
    var table = knee_tab();
    var div = document.getElementById('kneeswarm-chart');
    if (!table || !live) { return; }
    if (!window.Plotly) {
      if (!loading) {
        loading = true;
        var s = document.createElement('script'); s.src = '/kneeswarm/plotly.js'; s.onload = chart;
        document.head.appendChild(s);
      }
      return;
    }
    if (!div || !div.isConnected) {
      div = document.createElement('div'); div.id = 'kneeswarm-chart'; div.style.cssText = 'height:380px;margin:8px 0';
      var box = table.closest('.MuiTableContainer-root') || table;
      box.parentNode.insertBefore(div, box);
    }
    var rows = live.steps.filter(function (r) { return r.qps !== null; });
    rows.sort(function (a, b) { return a.users - b.users || a.step - b.step; });
    var x = rows.map(function (r) { return r.users; });
    var label = rows.map(function (r) { return String(r.step); });
    var hover = rows.map(function (r) { return 'step ' + r.step + ': ' + r.users + ' users' + (r.why ? '<br>' + r.why : ''); });
    var data = [
      {x: x, y: rows.map(function (r) { return r.qps; }), name: 'QPS', mode: 'lines+markers+text', text: label,
       textposition: 'top center', hovertext: hover, hoverinfo: 'text+y', line: {width: 3}},
      {x: x, y: rows.map(function (r) { return r.p99_ms; }), name: 'P99 ms', mode: 'lines+markers', yaxis: 'y2',
       hovertext: hover, hoverinfo: 'text+y', line: {dash: 'dot'}}];
    var names = [];  // a traffic mix: each class's P99 at each step, a dotted line on the P99 axis
    (live.class_steps || []).forEach(function (p) { if (names.indexOf(p['class']) < 0) { names.push(p['class']); } });
    names.forEach(function (name) {
      var pts = live.class_steps.filter(function (p) { return p['class'] === name && p.p99_ms !== null; });
      pts.sort(function (a, b) { return a.users - b.users || a.step - b.step; });
      data.push({x: pts.map(function (p) { return p.users; }), y: pts.map(function (p) { return p.p99_ms; }),
                 name: 'P99 ms ' + name, mode: 'lines+markers', yaxis: 'y2', line: {dash: 'dash', width: 1.5},
                 hoverinfo: 'name+x+y'});
    });
    var k = live.knee || {}, shapes = [], notes = [];
    if (k.bracket && k.bracket[0] !== null) {
      var hi = k.bracket[1] === null ? k.bracket[0] : k.bracket[1];
      shapes.push({type: 'rect', xref: 'x', yref: 'paper', x0: k.bracket[0], x1: hi, y0: 0, y1: 1,
                   fillcolor: '#1b5e20', opacity: 0.12, line: {width: 0}, name: 'knee bracket'});
      notes.push({x: k.bracket[0], y: 1, yref: 'paper', text: 'knee in [' + k.bracket[0] + ', ' +
                  (k.bracket[1] === null ? '?' : k.bracket[1]) + ']', showarrow: false, yanchor: 'bottom'});
    }
    if (k.users !== undefined && k.users !== null) {
      shapes.push({type: 'line', xref: 'x', yref: 'paper', x0: k.users, x1: k.users, y0: 0, y1: 1,
                   line: {color: '#1b5e20', width: 2, dash: 'dash'}, name: 'knee'});
      notes.push({x: k.users, y: 0.92, yref: 'paper', text: 'knee: ' + k.users + ' users', showarrow: false, xanchor: 'left'});
    }
    Plotly.react(div, data, {
      margin: {t: 30, r: 60, b: 40, l: 60}, xaxis: {title: {text: 'users'}}, shapes: shapes, annotations: notes,
      yaxis: {title: {text: 'QPS'}, rangemode: 'tozero'},
      yaxis2: {title: {text: 'P99 ms'}, overlaying: 'y', side: 'right', rangemode: 'tozero'},
      legend: {orientation: 'h'}, title: {text: k.how ? 'QPS and P99 by users (' + k.how + ')' : 'QPS and P99 by users'}
    }, {displaylogo: false});
  }
  poll(); setInterval(poll, 2000); setInterval(form, 300); setInterval(chart, 1000); setInterval(repetition, 1000);
})();
"""


def plotly_js() -> Response:
    """plotly.js from the installed plotly package (the report inlines the same), for the chart."""
    from plotly.offline import get_plotlyjs

    return Response(get_plotlyjs(), mimetype="text/javascript", headers={"Cache-Control": "max-age=86400"})


def add_plan_arguments(parser: Any, current: Callable[[str], str]) -> None:
    """The plan's fields as custom arguments shown in the start form; ``current(key)`` gives the
    value the form shows (the loaded plan's; "" before it is loaded)."""
    for option, key, text in PLAN_FIELDS:
        choices = CHOICES.get(key)  # a list the form shows as one (the plan's value, or none yet: "")
        parser.add_argument("--" + option.replace("_", "-"), default=current(key), include_in_web_ui=True,
                            help=f"{text} (default: the plan's)", choices=["", *choices] if choices else None)


def form_overrides(opts: Any) -> dict[str, Any]:
    """Plan overrides from the form / command line (empty fields: the plan's value); ValueError
    with one line naming the field when one is not a number."""
    out: dict[str, Any] = {}
    get = opts.get if hasattr(opts, "get") else (lambda k: getattr(opts, k, ""))  # a form, or parsed options
    for option, key, _ in PLAN_FIELDS:
        raw = str(get(option) or "").strip()
        if not raw:
            continue
        try:
            if key == "load.steps":
                out[key] = [int(x) for x in raw.replace(" ", "").split(",") if x]
            elif key == "load.hold" and raw == "auto":
                out[key] = raw
            elif key in NUMBER_KEYS:
                out[key] = float(raw)
            elif key in INTEGER_KEYS:
                out[key] = int(raw)
            else:
                out[key] = raw
        except ValueError:
            raise ValueError(f"{option.replace('kneeswarm_', '')}: not a number list/number: {raw!r}") from None
    if out.get("load.mode") == "search":  # the search chooses the steps: neither the form's grid steps
        out["load.steps"] = []  # nor the plan file's are for it
    return out


def check_binding(env: Any) -> str | None:
    """Bind the web UI to loopback unless told; the one-line reason to refuse to start, or None."""
    opts, web_ui = env.parsed_options, env.web_ui
    insecure = bool(getattr(opts, "kneeswarm_insecure_web", False))
    if web_ui is not None:
        if not getattr(opts, "web_host", ""):
            web_ui.host = "127.0.0.1"
        elif web_ui.host not in LOOPBACK and not insecure:
            if not getattr(opts, "web_login", False):
                return (f"the web UI would listen on {web_ui.host}: add --web-login (with {USER_ENV} and "
                        f"{PASSWORD_ENV} set) or --kneeswarm-insecure-web")
            if not (os.environ.get(USER_ENV) and os.environ.get(PASSWORD_ENV)):
                return f"--web-login needs {USER_ENV} and {PASSWORD_ENV} in the environment"
    host = getattr(opts, "master_bind_host", "*")
    if getattr(opts, "master", False) and host not in LOOPBACK and not insecure:
        return (f"the master's port would listen on {host} (no authentication on that channel): pass "
                f"--master-bind-host 127.0.0.1 or a private address with --kneeswarm-insecure-web")
    return None


def _login(web_ui: Any) -> None:
    """Flask-Login with one user from the environment (Locust's --web-login)."""
    from flask_login import UserMixin, login_user

    class User(UserMixin):
        def __init__(self, uid: str):
            self.id = uid

    if not web_ui.app.secret_key:  # Flask's session (the login) needs one; new at every start
        web_ui.app.secret_key = os.urandom(32)
    web_ui.login_manager.user_loader(lambda uid: User(uid) if uid == os.environ.get(USER_ENV) else None)
    web_ui.auth_args = {"username_password_callback": "/kneeswarm/login"}

    @web_ui.app.route("/kneeswarm/login", methods=["POST"])
    def kneeswarm_login() -> Response:
        user, password = request.form.get("username", ""), request.form.get("password", "")
        if hmac.compare_digest(user, os.environ.get(USER_ENV, "")) and hmac.compare_digest(
                password, os.environ.get(PASSWORD_ENV, "")) and user:
            login_user(User(user))
            return Response(status=302, headers={"Location": "/"})
        return Response(status=302, headers={"Location": "/login"})


class KneeTab:
    """The tabs, routes and live data of the web UI; ``live()`` gives the latest tables."""

    def __init__(self, env: Any, live: Callable[[], LiveJson], out: Callable[[], str],
                 validate: Callable[[Any], str | None], on_stop: Callable[[], None] = lambda: None,
                 mixed: bool = False):
        """``mixed``: the plan is a traffic mix, and the Knee classes tab is shown."""
        self.env, self.live, self.out, self.validate, self.on_stop = env, live, out, validate, on_stop
        web_ui = env.web_ui
        if getattr(env.parsed_options, "web_login", False):
            _login(web_ui)
        tables = [("knee", "Knee", STEP_COLUMNS), *([("knee-classes", "Knee classes", CLASS_COLUMNS)] if mixed else []),
                  ("knee-servers", "Knee servers", HOST_COLUMNS)]
        web_ui.template_args.update(
            extended_tabs=[{"title": title, "key": key} for key, title, _ in tables],
            extended_tables=[{"key": key, "structure": [{"key": k, "title": t} for k, t in columns]}
                             for key, _, columns in tables],
        )
        app = web_ui.app
        app.before_request(self.check_form)
        app.after_request(self.extend)
        app.add_url_rule("/kneeswarm/live.json", "kneeswarm_live", web_ui.auth_required_if_enabled(self.live_json))
        app.add_url_rule("/kneeswarm/knee.js", "kneeswarm_js", lambda: Response(KNEE_JS, mimetype="text/javascript"))
        app.add_url_rule("/kneeswarm/plotly.js", "kneeswarm_plotly", plotly_js)
        app.add_url_rule("/favicon.ico", "kneeswarm_favicon",  # a report page's browser asks for it
                         lambda: Response(status=302, headers={"Location": "/assets/favicon-light.png"}))
        app.add_url_rule("/kneeswarm/runs/<run_id>/<path:name>", "kneeswarm_run_file",
                         web_ui.auth_required_if_enabled(self.run_file))

    def check_form(self) -> Response | None:
        """A bad plan field in the start form: Locust's own failure answer, with one line.  Stop
        pressed: ``on_stop`` first (a series of repetitions starts no further test)."""
        if request.path == "/stop" and request.method == "POST":
            self.on_stop()
        if request.path == "/swarm" and request.method == "POST":
            problem = self.validate(request.form)
            if problem:
                return jsonify({"success": False, "message": problem, "host": self.env.host})
        return None

    def extend(self, response: Response) -> Response:
        """/stats/requests carries the Knee tables; every page loads knee.js (the report link)."""
        if request.path == "/stats/requests" and response.is_json:
            live = self.live()
            data = {**(response.json or {}), "extended_stats": [{"key": "knee", "data": live.get("steps", [])},
                                                        {"key": "knee-classes", "data": live.get("classes", [])},
                                                        {"key": "knee-servers", "data": live.get("hosts", [])}]}
            response.set_data(json.dumps(data))
        elif request.path == "/" and response.mimetype == "text/html":
            html = response.get_data(as_text=True)
            response.set_data(html.replace("</body>", '<script src="/kneeswarm/knee.js"></script></body>', 1))
        return response

    def live_json(self) -> Response:
        return jsonify(self.live())

    def run_file(self, run_id: str, name: str) -> Response:
        """A file of a run directory under --kneeswarm-out (send_from_directory refuses ../)."""
        root = Path(self.out()).resolve()
        if "/" in run_id or run_id.startswith("."):
            return Response("not found", status=404)
        return send_from_directory(root / run_id, name)
