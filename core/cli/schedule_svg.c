/* The SVG drawing of a simulated pipeline schedule (cli/schedule_svg.h). */
#include <stdio.h>
#include <string.h>

#include "loom/status.h"
#include "cli/schedule_svg.h"
#include "runtime/log.h"

static void xml_text(FILE *out, const char *text)
{
    for (; *text; text++)
        switch (*text) {
        case '<': fputs("&lt;", out); break;
        case '>': fputs("&gt;", out); break;
        case '&': fputs("&amp;", out); break;
        case '"': fputs("&quot;", out); break;
        default: fputc(*text, out);
        }
}

/* One arrow per receive, from the sender's row when its send ran to the
 * receiver's row when the data arrived (send + transfer). */
static void draw_transfers(FILE *out, const loom_schedule *s, const loom_schedule_timeline *tl,
                           double left, double top, double row, double gap, double unit)
{
    for (int r = 0; r < s->stages; r++)
        for (int i = 0; i < s->count[r]; i++) {
            loom_action a = s->actions[r][i];
            int stage = loom_schedule_stage(s, r, a.virtual_stage);
            int from;
            if (a.kind == LOOM_ACT_RECV_ACTIVATION)
                from = loom_schedule_rank_of(s, stage - 1);
            else if (a.kind == LOOM_ACT_RECV_GRADIENT)
                from = loom_schedule_rank_of(s, stage + 1);
            else
                continue;
            double arrival = tl->arrival[r][i], sent = arrival - tl->transfer;
            double y_from = top + from * (row + gap) + row / 2;
            double y_to = top + r * (row + gap) + row / 2;
            char what[160];
            loom_action_describe(s, r, i, what, sizeof what);
            fprintf(out, "<line class=\"transfer\" x1=\"%.2f\" y1=\"%.1f\" x2=\"%.2f\" "
                         "y2=\"%.1f\" stroke=\"#333333\" stroke-opacity=\"0.6\" "
                         "marker-end=\"url(#arrow)\"><title>%s, sent t = %g, arrived t = %g"
                         "</title></line>\n",
                    left + sent * unit, y_from, left + arrival * unit, y_to, what, sent, arrival);
        }
}

int loom_schedule_svg(const loom_schedule *s, const loom_schedule_timeline *tl, FILE *out)
{
    /* Colours from one qualitative palette; later virtual stages lighter. */
    static const char *fill[4] = {"#4e79a7", "#e15759", "#f28e2b", "#59a14f"};
    static const char *label[4] = {"forward", "backward", "backward-input", "backward-weight"};
    int p = s->stages, v = s->virtual_stages;
    double span = tl->makespan > 0.0 ? tl->makespan : 1.0;
    const double left = 70.0, top = 44.0, row = 30.0, gap = 6.0, legend = 40.0;
    double unit = 960.0 / span; /* pixels per unit of simulated time */
    if (unit < 4.0)
        unit = 4.0;
    if (unit > 48.0)
        unit = 48.0;
    double width = left + span * unit + 20.0;
    double height = top + p * (row + gap) + legend;
    fprintf(out, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
                 "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
                 "viewBox=\"0 0 %.0f %.0f\" font-family=\"sans-serif\">\n",
            width, height, width, height);
    fprintf(out, "<defs><pattern id=\"idle\" width=\"6\" height=\"6\" "
                 "patternUnits=\"userSpaceOnUse\" patternTransform=\"rotate(45)\">"
                 "<path d=\"M0 0 V6\" stroke=\"#bbbbbb\" stroke-width=\"2\"/></pattern>%s"
                 "</defs>\n",
            tl->transfer > 0.0 ? "<marker id=\"arrow\" viewBox=\"0 0 10 10\" refX=\"10\" "
                                 "refY=\"5\" markerWidth=\"6\" markerHeight=\"6\" "
                                 "orient=\"auto\"><path d=\"M0 0 L10 5 L0 10 z\" "
                                 "fill=\"#333333\"/></marker>"
                               : "");
    fprintf(out, "<rect class=\"background\" x=\"0\" y=\"0\" width=\"%.0f\" height=\"%.0f\" "
                 "fill=\"white\"/>\n", width, height);
    fprintf(out, "<text x=\"%.0f\" y=\"24\" font-size=\"15\">", left);
    xml_text(out, s->name);
    fprintf(out, ": p = %d, v = %d, m = %d, bubble %.1f%%", p, v, s->microbatches,
            100.0 * tl->bubble);
    if (tl->transfer > 0.0)
        fprintf(out, ", transfers %g", tl->transfer);
    fprintf(out, "</text>\n");
    for (int r = 0; r < p; r++) {
        double y = top + r * (row + gap);
        fprintf(out, "<text x=\"8\" y=\"%.1f\" font-size=\"12\">rank %d</text>\n",
                y + row / 2 + 4, r);
        /* idle: every gap between compute actions up to the makespan */
        double busy_until = 0.0;
        for (int i = 0; i <= s->count[r]; i++) {
            int done = i == s->count[r];
            if (!done && !loom_action_is_compute(s->actions[r][i].kind))
                continue;
            double t0 = done ? tl->makespan : tl->start[r][i];
            if (t0 > busy_until + 1e-12)
                fprintf(out, "<rect class=\"idle\" x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" "
                             "height=\"%.1f\" fill=\"url(#idle)\" stroke=\"#dddddd\"/>\n",
                        left + busy_until * unit, y, (t0 - busy_until) * unit, row);
            if (!done && tl->end[r][i] > busy_until)
                busy_until = tl->end[r][i];
        }
        for (int i = 0; i < s->count[r]; i++) {
            loom_action a = s->actions[r][i];
            if (!loom_action_is_compute(a.kind))
                continue;
            double x = left + tl->start[r][i] * unit, w = (tl->end[r][i] - tl->start[r][i]) * unit;
            double opacity = v > 1 ? 1.0 - 0.5 * a.virtual_stage / (v - 1) : 1.0;
            char what[160];
            loom_action_describe(s, r, i, what, sizeof what);
            fprintf(out, "<rect class=\"%s\" x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" "
                         "height=\"%.1f\" fill=\"%s\" fill-opacity=\"%.2f\" stroke=\"white\">"
                         "<title>%s, t = %g..%g</title></rect>\n",
                    label[a.kind], x, y, w, row, fill[a.kind], opacity, what, tl->start[r][i],
                    tl->end[r][i]);
            if (w >= 9.0)
                fprintf(out, "<text x=\"%.2f\" y=\"%.1f\" font-size=\"%.0f\" "
                             "text-anchor=\"middle\" fill=\"white\">%d</text>\n",
                        x + w / 2, y + row / 2 + 4, w >= 16.0 ? 11.0 : 8.0, (int)a.microbatch);
        }
    }
    if (tl->transfer > 0.0)
        draw_transfers(out, s, tl, left, top, row, gap, unit);
    double y = top + p * (row + gap) + 10.0, x = left;
    for (int k = 0; k < 4; k++) {
        fprintf(out, "<rect class=\"legend\" x=\"%.0f\" y=\"%.0f\" width=\"14\" height=\"14\" "
                     "fill=\"%s\"/><text x=\"%.0f\" y=\"%.0f\" font-size=\"12\">%s</text>\n",
                x, y, fill[k], x + 18, y + 11, label[k]);
        x += 40 + 8.0 * (double)strlen(label[k]);
    }
    fprintf(out, "<rect class=\"legend\" x=\"%.0f\" y=\"%.0f\" width=\"14\" height=\"14\" "
                 "fill=\"url(#idle)\" stroke=\"#dddddd\"/><text x=\"%.0f\" y=\"%.0f\" "
                 "font-size=\"12\">idle</text>\n",
            x, y, x + 18, y + 11);
    if (tl->transfer > 0.0) {
        x += 60;
        fprintf(out, "<line class=\"legend\" x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" "
                     "stroke=\"#333333\" marker-end=\"url(#arrow)\"/><text x=\"%.0f\" "
                     "y=\"%.0f\" font-size=\"12\">transfer</text>\n",
                x, y + 7, x + 14, y + 7, x + 18, y + 11);
        x += 60;
    }
    fprintf(out, "<text x=\"%.0f\" y=\"%.0f\" font-size=\"12\" fill=\"#555555\">numbers: "
                 "micro-batches%s</text>\n", x + 70, y + 11,
            v > 1 ? "; lighter: later virtual stages" : "");
    fprintf(out, "</svg>\n");
    return ferror(out) ? loom_fail(LOOM_ERR_INVALID, "schedule: writing the SVG failed (disk full?)")
                       : LOOM_OK;
}
