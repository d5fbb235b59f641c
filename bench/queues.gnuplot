# Messages/s per queue from bus_queues' raw output (its "chart|..." lines), as horizontal bars
# on a log scale: median, with the min-max of the runs as error bars.
#   gnuplot -e "datafile='bench/results/queues-<date>-<commit>.txt'; outfile='bench/results/queues.png'" \
#     bench/queues.gnuplot
if (!exists("datafile")) datafile = 'bench/results/queues.txt'
if (!exists("outfile")) outfile = 'bench/results/queues.png'

src = '< grep "^chart|" ' . datafile
set datafile separator '|'
stats src using 4 nooutput
rows = STATS_records
maxv = STATS_max

set terminal pngcairo size 1100, (180 + 28 * rows) font "DejaVu Sans,10" noenhanced
set output outfile
set title "In-process queues: 1 producer -> 1 consumer unless noted, pinned to 2 cores\nmedian and min-max of interleaved runs (M items/s, log scale)"
set logscale x 10
set xrange [1 : maxv * 4]
set yrange [-rows + 0.4 : 0.6]
set xlabel "M items/s"
set grid xtics mxtics
set key off
set ytics nomirror scale 0 font ",9"
set lmargin 52
set style fill solid 0.85 noborder

# class: 0 peer, 1 the bus, 2 plain reference ring
color(c) = c == 1 ? 0xd62728 : (c == 2 ? 0x7f7f7f : 0x1f77b4)

plot src using 4:(-$0):(1):4:(-$0 - 0.35):(-$0 + 0.35):(color($2)):ytic(3) \
       with boxxyerror lc rgb variable, \
     src using 4:(-$0):5:6 with xerrorbars lc rgb "black" pt 0, \
     src using ($6 * 1.08):(-$0):(sprintf("%.1f", $4)) with labels left font ",8"
