# Issue 12 N=8 charge per request from packing-raw.json (run in packing-run/packing/ of 2026-11-25-h100-packing-focus-raw.tgz)
import json, statistics as st
d = json.load(open('packing-raw.json'))
k = d['kinds'][0]; cal = k['calibration']
g, e = cal['gpu_s_per_iter'], cal['eager_s_per_iter']
print("graph %.3f ms eager %.3f ms" % (g*1e3, e*1e3))
ph = k['phases']
def agg(m): return [sum(s['rate'] for s in p['services']) for p in ph if p['mode']==m]
for m in ('alone','plain','memonly','hard'):
    a = agg(m); print(m, ["%.1f"%x for x in a], "mean %.1f req/s"%st.mean(a))
plain = st.mean(agg('plain'))
print("plain: device per request if 100%% busy: %.3f ms (%.3fx eager)" % (1e3/plain, 1/plain/e))
print("plain eager-busy %.1f %%" % (100*plain*e))
rows=[]
for i,p in enumerate(ph):
    if p['mode']!='hard': continue
    t0,tm,t1 = p['t']
    nxt = ph[i+1]['t'][0] if i+1 < len(ph) else None
    for s in p['services']:
        # pacer_share is over (ta-tb) ~ [t0-0.3, t1+recv]; the service ran t0..t1
        span = (nxt - t0) if nxt else 3.8
        busy = s['pacer_share']/100*span      # upper bound of ta-tb
        busy_lo = s['pacer_share']/100*(t1-t0+0.3)
        rate = s['rate']
        rows.append(dict(rep=p['rep'], name=s['name'], rate=rate, share=s['pacer_share'],
            thr=s['throttled_s']/(t1-t0), load=s['offered_load'], paths=s['paths'],
            run_share_lo=100*busy_lo/(t1-t0), run_share_hi=100*busy/(t1-t0),
            c_lo=busy_lo/(t1-t0)/rate, c_hi=busy/(t1-t0)/rate, lp50=s['launch_p50_s'], p50=s['p50_s']))
for r in rows[:8]: print(r)
def m(key): return st.mean(r[key] for r in rows), min(r[key] for r in rows), max(r[key] for r in rows)
for key in ('rate','share','thr','load','run_share_lo','run_share_hi','c_lo','c_hi','lp50','p50'):
    print(key, ["%.5g"%x for x in m(key)])
cl, ch = m('c_lo')[0], m('c_hi')[0]
print("charge/request %.3f..%.3f ms = %.2f..%.2fx eager, %.2f..%.2fx graph, %.2f..%.2fx plain-saturated" % (cl*1e3, ch*1e3, cl/e, ch/e, cl/g, ch/g, cl*plain, ch*plain))
cs = st.mean(r['share'] for r in rows)/100/st.mean(r['rate'] for r in rows)
print("naive charge/request (pacer_share/rate) %.3f ms = %.2fx eager" % (cs*1e3, cs/e))
for nk in (160,175,200,250):
    print("nk=%d: eager %.2f us/kernel, over-charge %.2f..%.2f us/kernel (naive %.2f), band at mean kernel %.2f us" % (nk, e/nk*1e6, (cl-e)/nk*1e6, (ch-e)/nk*1e6, (cs-e)/nk*1e6, (e/nk*1e6)/8+2))
# cap from shares
for c,name in ((e,'eager'),(1/plain,'plain-sat'),(cs,'naive'),(ch,'hi')):
    cap = 0.12/c; print("cap at %s charge: %.1f req/s per service -> %.2fx plain" % (name, cap, min(cap*8, 1e9)/plain))
# nvml
nv = d['nvml']
for p in ph:
    t0,tm,t1 = p['t']; xs=[x for x in nv if 'util' in x and tm<=x['t']<=t1]
    if xs: print(p['mode'], p['rep'], "util %.1f mhz %.0f n=%d" % (st.mean(x['util'] for x in xs), st.mean(x['sm_mhz'] for x in xs), len(xs)))
