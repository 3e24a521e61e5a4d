# plot-es.gp -- return against iteration from the ES example's --log file.
#
#   build/bin/es --env cartpole --log es-cartpole.log
#   gnuplot -e "log='es-cartpole.log'; out='docs/examples/es-cartpole.png'" \
#           docs/examples/plot-es.gp
#
# The log's rows are "iteration mean best center elapsed" ('#' starts a
# comment line).  log and out default to es-cartpole.log and
# es-cartpole.png in the working directory; title may be set the same way,
# so the script serves the other environments' logs too.
if (!exists("log")) log = "es-cartpole.log"
if (!exists("out")) out = "es-cartpole.png"
if (!exists("title")) title = "ES on cart-pole (es --env cartpole, 2 workers)"

set terminal pngcairo size 800,480 font "sans,10"
set output out
set title title
set xlabel "iteration"
set ylabel "episode return"
set key bottom right
set grid
set autoscale fix                        # the data range, plus:
set offsets 0.5, 0.5, graph 0.06, graph 0.04 # margins off the frame
plot log using 1:3 with linespoints pt 7 ps 0.6 title "best perturbation", \
     log using 1:2 with linespoints pt 5 ps 0.6 title "population mean", \
     log using 1:4 with linespoints pt 9 ps 0.9 lw 2 title "unperturbed policy (5 episodes)"
